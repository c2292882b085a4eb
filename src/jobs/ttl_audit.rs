//! The TTL auditor (the classic "if TTL = -1 then EXPIRE" compensation) walks the keys of every
//! counter (SCAN on the server, or on every cluster primary, paced to
//! `jobs.ttl_audit.keys_per_second`) and gives each key found without expiry the one its window
//! implies (`PEXPIREAT … NX`: a key that got an expiry meanwhile keeps it). tally never writes a
//! counter without expiry; such keys come from other writers, `PERSIST`, or restores.

use super::JobError;
use crate::key::glob_prefix;
use std::time::{Duration, Instant};

use tally_counters::conn::{Conn, Node};
use tally_counters::model::CounterSpec;
use tally_counters::request::Client;

use crate::ops::metrics::Metrics;

/// One walk over every counter's keys on every node; the number of keys repaired.
pub async fn pass(
    client: &Client,
    specs: &[CounterSpec],
    keys_per_second: u64,
    metrics: &Metrics,
) -> Result<(), JobError> {
    let mut conn = client.conn().await?;
    let nodes = conn.primaries().await?;
    let mut repaired = 0;
    for node in &nodes {
        for spec in specs {
            repaired += audit_counter(&mut conn, node, spec, keys_per_second, metrics).await?;
        }
    }
    if repaired > 0 {
        tracing::warn!(repaired, "ttl audit: counter keys without expiry repaired");
    }
    Ok(())
}

async fn audit_counter(
    conn: &mut Conn,
    node: &Node,
    spec: &CounterSpec,
    keys_per_second: u64,
    metrics: &Metrics,
) -> Result<u64, JobError> {
    let pattern = glob_prefix(spec.written_template().literal_prefix());
    let scanned = metrics.jobs.keys_scanned.with_label_values(&[&spec.name]);
    let fixed = metrics.jobs.keys_repaired.with_label_values(&[&spec.name]);
    let mut cursor: u64 = 0;
    let mut repaired = 0;
    loop {
        let started = Instant::now();
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(500);
        let (next, keys): (u64, Vec<Vec<u8>>) = conn.query_on(node, &scan).await?;
        scanned.inc_by(keys.len() as u64);
        for key in &keys {
            let ttl: i64 = conn.query(redis::cmd("PTTL").arg(key)).await?;
            if ttl != -1 {
                continue;
            }
            // Not one of this counter's keys (another writer's key under the same prefix).
            let Some(at) = spec.stored_expire_at_of_key(key) else {
                continue;
            };
            let set: i64 = conn
                .query(redis::cmd("PEXPIREAT").arg(key).arg(at).arg("NX"))
                .await?;
            if set == 1 {
                repaired += 1;
                fixed.inc();
                tracing::warn!(
                    counter = %spec.name,
                    key = %String::from_utf8_lossy(key),
                    expire_at_ms = at,
                    "ttl audit: key had no expiry"
                );
            }
        }
        // Pace: this batch may take keys / keys_per_second.
        let budget = Duration::from_secs_f64(keys.len() as f64 / keys_per_second as f64);
        if let Some(rest) = budget.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        cursor = next;
        if cursor == 0 {
            return Ok(repaired);
        }
    }
}
