//! `output.tombstones`: when a published window's keys expire (window end + retention, the
//! instant after which the stream counts nothing more into it), every key the window published
//! is produced again with a null value, so that a compacted topic forgets it as Redis does.
//!
//! The keys come from the window's published-values hash (what the output topic holds: the
//! snapshot, corrections, updates), which with tombstones outlives the window's keys by
//! [`snapshot::TOMBSTONE_GRACE_MS`]. A window is noted in a sorted set per counter (scored by its
//! expiry) when its final attempt starts, and taken out once Kafka acknowledged its tombstones:
//! at least once (a publisher killed in between produces them again; a tombstone repeated is
//! harmless). Corrections of a window stop at its expiry (see the caller), so none follows its
//! tombstones.

use super::PublishError;
use tally_counters::conn::Conn;
use tally_counters::model::CounterSpec;
use tally_counters::window::Window;

use super::kafka::{Kafka, Outgoing};
use super::record::Emit;
use super::snapshot;
use crate::ops::metrics::Metrics;

/// Windows handled per pass and counter (the rest in the next passes).
const BATCH: usize = 100;

/// The counter's windows waiting for tombstones: window start → due time (the window's keys'
/// expiry). Beside the counter's `progress_key`; the `:tombstones` suffix cannot end another of
/// tally's keys (names in them are escaped, with no `:`).
pub fn index_key(progress_key: &str) -> String {
    format!("{progress_key}:tombstones")
}

/// Note the published `window`: its tombstones are due when its keys expire.
pub async fn note(
    conn: &mut Conn,
    spec: &CounterSpec,
    window: &Window,
    progress_key: &str,
) -> Result<(), PublishError> {
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(index_key(progress_key))
        .arg("NX")
        .arg(spec.expire_at(window.end_ms))
        .arg(window.start_ms);
    let _: i64 = conn.query(&zadd).await?;
    Ok(())
}

/// What producing tombstones needs.
pub struct Tombstoner<'a> {
    /// Produces the tombstones to the output topic.
    pub kafka: &'a Kafka,
    /// Where the tombstones are counted (`records{kind="tombstone"}`).
    pub metrics: &'a Metrics,
    /// The published-values hash of the window starting at a time.
    pub hash_of: &'a (dyn Fn(i64) -> String + Sync),
}

impl Tombstoner<'_> {
    /// Produce the tombstones of `spec`'s windows due at `now` (Redis' clock, Unix ms).
    pub async fn pass(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        progress_key: &str,
        now: i64,
    ) -> Result<(), PublishError> {
        let output = spec
            .output
            .as_ref()
            .expect("called for counters with an output");
        let index = index_key(progress_key);
        let mut due = redis::cmd("ZRANGEBYSCORE");
        due.arg(&index)
            .arg("-inf")
            .arg(now)
            .arg("LIMIT")
            .arg(0)
            .arg(BATCH);
        let starts: Vec<i64> = conn.query(&due).await?;
        for start in starts {
            let window = spec.window.window_of(start);
            let keys = snapshot::answers(conn, &(self.hash_of)(start)).await?;
            if keys.is_empty() {
                tracing::warn!(
                    counter = %spec.name,
                    window_start = start,
                    "no tombstones: the window's published values expired before the publisher got to them"
                );
            }
            for chunk in keys.keys().collect::<Vec<_>>().chunks(10_000) {
                let records = chunk.iter().map(|key| Outgoing {
                    key,
                    payload: None,
                    headers: None,
                    timestamp: window.end_ms,
                });
                self.kafka.send(&output.topic, records.collect()).await?;
            }
            self.metrics
                .publish
                .records
                .with_label_values(&[&spec.name, Emit::Tombstone.label()])
                .inc_by(keys.len() as u64);
            let _: i64 = conn
                .query(redis::cmd("ZREM").arg(&index).arg(start))
                .await?;
        }
        Ok(())
    }
}
