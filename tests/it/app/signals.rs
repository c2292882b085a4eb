//! SIGTERM at random moments after start — while the configuration loads, while Redis and Kafka
//! are reached, while partitions are assigned, mid-flush — always ends in a clean drain and exit
//! code 0, for `tally serve` and for `tally run` (five replicas at a time in one group). After
//! the `run` loop, a last replica catches up and every key is compared with the truth: the
//! drains lost and doubled nothing.

use std::time::{Duration, Instant};

use crate::common::process::{kafka_toml, BrokerProcess, TallyProcess};
use crate::common::request::PLAYS;
use crate::common::stream::{self, Stream, COUNTERS};
use rand::{RngExt, SeedableRng};
use tally_testkit::local_redis::LocalRedis;

const PARTITIONS: i32 = 4;
/// Processes signalled per command.
const SIGNALS: usize = 50;
/// Processes alive at once.
const AT_ONCE: usize = 5;

fn run_config(bootstrap: &str, redis: &str) -> String {
    let kafka = kafka_toml(bootstrap, "sig", "g-sig");
    format!(
        r#"{kafka}
[redis]
url = "{redis}"
[flush]
interval = "50ms"
shutdown_grace = "20s"
{COUNTERS}"#
    )
}

fn serve_config(redis: &str) -> String {
    format!(
        r#"
[redis]
url = "{redis}"
{PLAYS}
[jobs.ttl_audit]
enabled = true
interval = "100ms"
lease = "600ms"
"#
    )
}

/// Whether process `pid` catches SIGTERM (its handler is installed): bit 15 of `SigCgt` in
/// `/proc/<pid>/status`.
fn catches_sigterm(pid: i32) -> bool {
    catches(pid, libc::SIGTERM)
}

/// Whether process `pid` has a handler for `sig` (its bit of `SigCgt`).
fn catches(pid: i32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// SIGHUP, which daemons take as "reload", never stops `tally serve` (its default action would,
/// with exit 129 and no drain): each one is logged, the process keeps serving, and SIGTERM
/// still drains it to exit 0. `tally run` shares the handler (`main`'s `on_signals`).
#[test]
fn sighup_never_stops_the_process() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut p = TallyProcess::start_command("serve", &serve_config(&redis.url()), "sighup");
    // Serving (so its log is set up), with a SIGHUP handler.
    let started = Instant::now();
    while !(catches(p.pid(), libc::SIGHUP)
        && tally_testkit::http::get(p.port, "/health/live").is_some())
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not serving with a SIGHUP handler:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for n in 1..=3 {
        p.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(20);
        while p.log().matches("SIGHUP").count() < n {
            assert!(
                Instant::now() < deadline,
                "SIGHUP {n} not logged:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            tally_testkit::http::get(p.port, "/health/live").is_some(),
            "still serving after SIGHUP {n}:\n{}",
            p.log()
        );
    }
    let status = p.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM after SIGHUPs exits 0: {status:?}\n{}",
        p.log()
    );
}

/// Start `SIGNALS` processes of `command`, `AT_ONCE` at a time, and SIGTERM each at a random
/// moment up to 1.5 s after it can hear the signal (its handler is installed: the first thing
/// `main` does; before that, exec and dynamic linking, no program can catch one). Every exit
/// status, with the log of any that failed.
fn signal_loop(command: &'static str, config: String, seed: u64) -> Vec<String> {
    let threads: Vec<_> = (0..AT_ONCE)
        .map(|t| {
            let config = config.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed + t as u64);
                let mut failed = Vec::new();
                for i in 0..SIGNALS / AT_ONCE {
                    let mut p =
                        TallyProcess::start_command(command, &config, &format!("sig{t}-{i}"));
                    let spawned = Instant::now();
                    while !catches_sigterm(p.pid()) {
                        assert!(
                            spawned.elapsed() < Duration::from_secs(20),
                            "{command} never installed a SIGTERM handler:\n{}",
                            p.log()
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let after = Duration::from_millis(rng.random_range(0..1500));
                    std::thread::sleep(after);
                    let status = p.terminate(Duration::from_secs(40));
                    if !status.success() {
                        failed.push(format!(
                            "{command} signalled {after:?} after its handler exited {status:?}:\n{}",
                            p.log()
                        ));
                    }
                }
                failed
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("signal thread"))
        .collect()
}

#[test]
fn serve_exits_zero_on_sigterm_at_any_moment() {
    let redis = LocalRedis::start(&[]).unwrap();
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let failed = signal_loop("serve", serve_config(&redis.url()), seed);
    assert!(
        failed.is_empty(),
        "{} of {SIGNALS}: {}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn run_exits_zero_on_sigterm_at_any_moment_and_counts_exactly() {
    let broker = BrokerProcess::start(&[("sig", PARTITIONS)]);
    let redis = LocalRedis::start(&[]).unwrap();
    let cfg = run_config(&broker.bootstrap, &redis.url());
    let stream = Stream {
        n: 60_000,
        partitions: PARTITIONS,
        now_ms: chrono::Utc::now().timestamp_millis(),
    };
    // Events keep arriving through the whole loop, so signals land mid-flush too.
    let (producer, _) = stream.produce(&broker.bootstrap, "sig", 1_000);
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let failed = signal_loop("run", cfg.clone(), seed);
    assert!(
        failed.is_empty(),
        "{} of {SIGNALS}: {}",
        failed.len(),
        failed.join("\n")
    );

    let produced = producer.join().expect("producer");
    let mut last = TallyProcess::start(&cfg, "sig-final");
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while stream::applied(&mut conn, "g-sig", "sig", PARTITIONS) != produced {
        assert!(Instant::now() < deadline, "no catch-up:\n{}", last.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(last.terminate(Duration::from_secs(40)).success());
    let (keys, mismatches) = stream::compare(&mut conn, &stream.truth());
    assert!(keys > 0);
    assert_eq!(
        mismatches, 0,
        "{mismatches} of {keys} keys differ from the truth"
    );
}

/// SIGHUP reads `log.level` again from the configuration file: `warn` at start (an info line
/// is not written), `info` after the file is rewritten and SIGHUP sent (the reload's own info
/// line appears); a filter that does not parse keeps the one in force, logged as an error.
#[test]
fn sighup_reloads_the_log_filter_from_the_file() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = std::env::temp_dir().join(format!("tally-loglevel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (config, log) = (dir.join("tally.toml"), dir.join("tally.log"));
    let port = tally_testkit::local_redis::free_port().unwrap();
    let write = |level: &str| {
        let text = format!(
            "{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[log]\nlevel = \"{level}\"\n",
            serve_config(&redis.url())
        );
        std::fs::write(config.with_extension("tmp"), text).unwrap();
        std::fs::rename(config.with_extension("tmp"), &config).unwrap();
    };
    write("warn");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env_remove("TALLY_LOG")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait = |what: &str, cond: &dyn Fn(&str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond(&read()) {
            assert!(Instant::now() < deadline, "{what}:\n{}", read());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let started = Instant::now();
    while !(catches(pid, libc::SIGHUP) && tally_testkit::http::get(port, "/health/live").is_some())
    {
        assert!(started.elapsed() < Duration::from_secs(20), "{}", read());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !read().contains("INFO"),
        "log.level = warn writes no info line:\n{}",
        read()
    );
    write("info");
    unsafe { libc::kill(pid, libc::SIGHUP) };
    wait("the info filter in force after SIGHUP", &|l| {
        l.contains("log filter (log.level) in force")
    });
    write("info,[[not a filter");
    unsafe { libc::kill(pid, libc::SIGHUP) };
    wait("a bad filter refused", &|l| {
        l.contains("ERROR") && l.contains("log filter stays")
    });
    assert!(tally_testkit::http::get(port, "/health/live").is_some());
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", read());
}
