//! `late = "drop"`: a published window is final in the output topic. A key whose answer changed
//! after its window was published (a late event within retention, counted in Redis as always)
//! produces no correction: the change is counted (`tally_publish_late_dropped_total`) and, with
//! `late_topic`, written there as the correction it would have been, with headers saying why.
//!
//! What was dropped is remembered per window in a hash beside the published-values hash (same
//! expiry), so that a change is dropped once, not at every look: the published-values hash
//! keeps holding what the output topic holds (the tombstones are produced from it). A late
//! record is produced, acknowledged, then remembered: at least once.

use super::PublishError;
use rdkafka::message::{Header, OwnedHeaders};
use tally_counters::conn::Conn;
use tally_counters::model::CounterSpec;
use tally_counters::window::Window;

use super::cells::Cell;
use super::kafka::{Kafka, Outgoing};
use super::record::{self, Emit};
use super::snapshot;
use crate::ops::metrics::Metrics;

/// The `tally-reason` header of a late record.
pub const REASON: &str = "late-after-final";

/// The hash of the answers dropped for a window, beside its published-values `hash`. The
/// `:late` suffix cannot end another of tally's keys: names in them are escaped, with no `:`.
pub fn dropped_hash(hash: &str) -> String {
    format!("{hash}:late")
}

/// What a drop needs besides the window.
pub struct Dropper<'a> {
    /// Produces to the late topic.
    pub kafka: &'a Kafka,
    /// Where the dropped changes and the late records are counted.
    pub metrics: &'a Metrics,
    /// The window's published-values hash.
    pub hash: &'a str,
}

impl Dropper<'_> {
    /// Drop the cells of `cells` whose answer differs from the one published (or last dropped).
    pub async fn drop_changes(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        cells: Vec<Cell>,
    ) -> Result<(), PublishError> {
        if cells.is_empty() {
            return Ok(());
        }
        let late_hash = dropped_hash(self.hash);
        let published = hmget(conn, self.hash, &cells).await?;
        let dropped = hmget(conn, &late_hash, &cells).await?;
        let changed = changed(cells, published, dropped);
        if changed.is_empty() {
            return Ok(());
        }
        let output = spec
            .output
            .as_ref()
            .expect("called for counters with an output");
        if let Some(topic) = &output.late_topic {
            self.produce(conn, spec, window, topic, &changed).await?;
        }
        snapshot::record(conn, spec, window, &late_hash, &changed, false).await?;
        self.metrics
            .publish
            .late_dropped
            .with_label_values(&[&spec.name])
            .inc_by(changed.len() as u64);
        Ok(())
    }

    /// Write `cells` to the late `topic`, each the correction it would have been (with the
    /// watermark its window was published at), and wait for Kafka's acknowledgement.
    async fn produce(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        topic: &str,
        cells: &[Cell],
    ) -> Result<(), PublishError> {
        let closed_by: Option<i64> = conn
            .query(redis::cmd("HGET").arg(self.hash).arg("@watermark"))
            .await?;
        let closed_by = closed_by.unwrap_or(window.end_ms);
        let (start, end) = (window.start_ms.to_string(), window.end_ms.to_string());
        let headers = OwnedHeaders::new()
            .insert(header("tally-reason", REASON))
            .insert(header("tally-counter", &spec.name))
            .insert(header("tally-window-start", &start))
            .insert(header("tally-window-end", &end));
        for chunk in cells.chunks(10_000) {
            let payloads: Vec<String> = chunk
                .iter()
                .map(|c| record::value(spec, window, c, closed_by, Emit::Late))
                .collect();
            let records = chunk.iter().zip(&payloads).map(|(c, p)| Outgoing {
                key: &c.key,
                payload: Some(p),
                headers: Some(headers.clone()),
                timestamp: window.end_ms,
            });
            self.kafka.send(topic, records.collect()).await?;
        }
        self.metrics
            .publish
            .records
            .with_label_values(&[&spec.name, Emit::Late.label()])
            .inc_by(cells.len() as u64);
        Ok(())
    }
}

/// The cells whose answer differs from the one last dropped for their key, or if none was,
/// from the one published (a key no record carried, created by a late event, differs).
/// `published` and `dropped` are the recorded answers of `cells`' keys, in order.
fn changed(
    cells: Vec<Cell>,
    published: Vec<Option<String>>,
    dropped: Vec<Option<String>>,
) -> Vec<Cell> {
    cells
        .into_iter()
        .zip(published.into_iter().zip(dropped))
        .filter(|(c, (p, d))| d.as_ref().or(p.as_ref()) != Some(&c.answer()))
        .map(|(c, _)| c)
        .collect()
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// The answers `hash` records for `cells`' keys.
async fn hmget(
    conn: &mut Conn,
    hash: &str,
    cells: &[Cell],
) -> Result<Vec<Option<String>>, PublishError> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(hash);
    for c in cells {
        cmd.arg(&c.key);
    }
    Ok(conn.query(&cmd).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(key: &str, value: i64) -> Cell {
        Cell {
            key: key.into(),
            dims: vec![key.into()],
            value,
            top: None,
        }
    }

    #[test]
    fn a_change_is_dropped_once_and_again_only_when_it_changes_again() {
        let some = |v: &str| Some(v.to_string());
        let cells = vec![
            cell("same", 1),
            cell("changed", 3),
            cell("dropped", 3),
            cell("again", 4),
            cell("new", 1),
        ];
        let published = vec![some("1"), some("1"), some("1"), some("1"), None];
        let dropped = vec![None, None, some("3"), some("3"), None];
        let keys: Vec<String> = changed(cells, published, dropped)
            .into_iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(keys, ["changed", "again", "new"]);
    }
}
