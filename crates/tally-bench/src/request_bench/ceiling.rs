//! The limit script's ceiling: `redis-benchmark -P 16 EVALSHA` of the product's own limit script
//! (one decision per call) beside its batch script (8 and 32 decisions per call), with Redis'
//! CPU per decision read from `INFO cpu` (steadier than throughput on a shared machine).

use redis::Value;
use tally_counters::request::{LIMIT_BATCH_LUA, LIMIT_LUA};
use tally_testkit::local_redis::LocalRedis;

/// Decisions per run.
const DECISIONS: usize = 200_000;

/// One decision's keys and ARGV (the script header's layout) for `algorithms` (1 fixed,
/// 2 sliding log, 3 sliding counter, 4 GCRA): limit 100 per 1 s, cost 1, random subjects.
fn decision(algorithms: &[u8]) -> (Vec<String>, Vec<String>) {
    let keys = algorithms
        .iter()
        .map(|a| format!("ceiling:{a}:{{__rand_int__}}"))
        .collect();
    let mut args = vec!["id__rand_int__".to_string(), "apply".to_string()];
    for a in algorithms {
        args.extend([
            a.to_string(),
            "100".into(),
            "1000".into(),
            "100".into(),
            "0".into(),
        ]);
        args.push("1".into());
    }
    args.extend(algorithms.iter().map(|_| "0".to_string()));
    (keys, args)
}

/// Redis' user + system CPU seconds so far.
fn redis_cpu(conn: &mut redis::Connection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(conn)?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum())
}

/// Calls/s of `redis-benchmark -P 16 -c 50` sending `args`, `calls` times.
fn benchmark(port: u16, calls: usize, args: &[String]) -> anyhow::Result<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-r",
            "10000",
            "-c",
            "50",
            "-P",
            "16",
            "-q",
        ])
        .args(["-n", &calls.to_string()])
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit('\r')
        .flat_map(|s| s.lines())
        .find_map(|l| {
            let (_, rest) = l.split_once(": ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .ok_or_else(|| anyhow::anyhow!("redis-benchmark said: {text}"))
}

/// Prints one row per (policy set, decisions per call).
pub fn run(redis: &LocalRedis) -> anyhow::Result<()> {
    let mut conn = redis::Client::open(redis.url())?.get_connection()?;
    let load = |conn: &mut redis::Connection, text: &str| -> anyhow::Result<String> {
        let v: Value = redis::cmd("SCRIPT").arg("LOAD").arg(text).query(conn)?;
        Ok(redis::from_redis_value(v)?)
    };
    let single = load(&mut conn, LIMIT_LUA)?;
    let batch = load(&mut conn, LIMIT_BATCH_LUA)?;
    println!("| policies | decisions per call | decisions/s | Redis CPU µs per decision |");
    println!("|---|---|---|---|");
    for (label, algorithms) in [
        ("fixed", &[1u8][..]),
        ("sliding_log", &[2]),
        ("sliding_counter", &[3]),
        ("gcra", &[4]),
        ("gcra + fixed", &[4, 1]),
    ] {
        let (keys, args) = decision(algorithms);
        for per_call in [1usize, 8, 32] {
            let mut cmd = vec!["EVALSHA".to_string()];
            if per_call == 1 {
                cmd.extend([single.clone(), keys.len().to_string()]);
                cmd.extend(keys.iter().cloned());
                cmd.extend(args.iter().cloned());
            } else {
                cmd.extend([batch.clone(), (keys.len() * per_call).to_string()]);
                for _ in 0..per_call {
                    cmd.extend(keys.iter().cloned());
                }
                cmd.push(per_call.to_string());
                for _ in 0..per_call {
                    cmd.extend([keys.len().to_string(), args.len().to_string()]);
                }
                for _ in 0..per_call {
                    cmd.extend(args.iter().cloned());
                }
            }
            let calls = DECISIONS / per_call;
            let before = redis_cpu(&mut conn)?;
            let rate = benchmark(redis.port, calls, &cmd)?;
            let cpu = redis_cpu(&mut conn)? - before;
            println!(
                "| {label} | {per_call} | {:.0} | {:.1} |",
                rate * per_call as f64,
                cpu * 1e6 / (calls * per_call) as f64
            );
        }
    }
    Ok(())
}
