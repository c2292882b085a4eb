//! Redis helpers: connections, `INFO` snapshots and the work done between two of them, and the
//! check that the counters in Redis add up to the events.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::COUNTER_PATTERN;

pub fn redis_conn(url: &str) -> anyhow::Result<redis::Connection> {
    Ok(redis::Client::open(url)?.get_connection()?)
}

/// `INFO <section>` as key → value.
pub fn redis_info(
    conn: &mut redis::Connection,
    section: &str,
) -> anyhow::Result<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(conn)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// What Redis did between two snapshots.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct RedisWork {
    /// total_commands_processed (top-level commands; see `calls`).
    pub commands: f64,
    /// Calls per command name (commandstats), including commands run inside scripts.
    pub calls: HashMap<String, f64>,
    /// used_cpu_user + used_cpu_sys of the server.
    pub cpu: f64,
}

#[derive(Debug, Clone)]
pub struct RedisSnapshot {
    pub commands: f64,
    pub calls: HashMap<String, f64>,
    pub cpu: f64,
}

pub fn redis_snapshot(conn: &mut redis::Connection) -> anyhow::Result<RedisSnapshot> {
    let stats = redis_info(conn, "stats")?;
    let cpu = redis_info(conn, "cpu")?;
    let cmds = redis_info(conn, "commandstats")?;
    let num = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
    };
    let calls = cmds
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?;
            let calls = v
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect();
    Ok(RedisSnapshot {
        commands: num(&stats, "total_commands_processed"),
        calls,
        cpu: num(&cpu, "used_cpu_user") + num(&cpu, "used_cpu_sys"),
    })
}

impl RedisSnapshot {
    /// Work done since `self`, minus `own` top-level commands the benchmark itself sent
    /// (including the INFO calls of the snapshot).
    pub fn work_until(&self, after: &RedisSnapshot, own: f64) -> RedisWork {
        let mut calls = HashMap::new();
        for (k, v) in &after.calls {
            let d = v - self.calls.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                calls.insert(k.clone(), d);
            }
        }
        RedisWork {
            commands: after.commands - self.commands - own,
            calls,
            cpu: after.cpu - self.cpu,
        }
    }
}

impl RedisWork {
    /// The work of several servers together.
    pub fn sum(servers: &[RedisWork]) -> RedisWork {
        let mut total = RedisWork::default();
        for w in servers {
            total.commands += w.commands;
            total.cpu += w.cpu;
            for (k, v) in &w.calls {
                *total.calls.entry(k.clone()).or_default() += v;
            }
        }
        total
    }

    pub fn calls_of(&self, name: &str) -> f64 {
        self.calls.get(name).copied().unwrap_or(0.0)
    }

    /// Commands executed inside scripts (commandstats of the data commands the scripts use;
    /// the benchmark sends none of these itself while measuring).
    pub fn script_inner(&self) -> f64 {
        [
            "get",
            "set",
            "time",
            "incrby",
            "pttl",
            "pexpireat",
            "expireat",
        ]
        .iter()
        .map(|c| self.calls_of(c))
        .sum()
    }

    /// Commands clients sent (Redis' total_commands_processed also counts those run by scripts).
    pub fn top_level(&self) -> f64 {
        self.commands - self.script_inner()
    }
}

pub fn flushall(conn: &mut redis::Connection) -> anyhow::Result<()> {
    redis::cmd("FLUSHALL").query::<()>(conn)?;
    Ok(())
}

/// (number of counter keys, sum of their values), by SCAN: to check the benchmark did the work.
pub fn sum_counters(conn: &mut redis::Connection) -> anyhow::Result<(u64, i64)> {
    let (mut cursor, mut keys_seen, mut sum) = (0u64, 0u64, 0i64);
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(COUNTER_PATTERN)
            .arg("COUNT")
            .arg(5000)
            .query(conn)?;
        if !keys.is_empty() {
            let values: Vec<Option<i64>> = redis::cmd("MGET").arg(&keys).query(conn)?;
            keys_seen += keys.len() as u64;
            sum += values.into_iter().flatten().sum::<i64>();
        }
        cursor = next;
        if cursor == 0 {
            return Ok((keys_seen, sum));
        }
    }
}
