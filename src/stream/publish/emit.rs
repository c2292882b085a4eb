//! A window's records to Kafka: the final results of a closed window (after its write-ahead
//! [`snapshot`]), the corrections and updates that follow, and what was published recorded in
//! the window's hash. [`Emitter`] borrows the publisher's producer, metrics and key scope; the
//! publisher decides which windows to publish ([`super::Publisher`]).

use super::PublishError;
use tally_counters::config::OutputLate;
use tally_counters::conn::Conn;
use tally_counters::model::state_keys::FenceScope;
use tally_counters::model::CounterSpec;
use tally_counters::window::Window;

use super::cells::Cell;
use super::kafka::{Kafka, Outgoing};
use super::record::{self, Emit};
use super::{late, progress, snapshot, tombstones};
use crate::ops::metrics::Metrics;

/// Produces a counter's window results, borrowing the publisher's parts.
pub(super) struct Emitter<'p> {
    pub(super) kafka: &'p Kafka,
    pub(super) metrics: &'p Metrics,
    pub(super) scope: &'p FenceScope,
}

impl Emitter<'_> {
    /// The hash of what was published for `window` of `spec` (and the snapshot's state).
    fn values_hash(&self, spec: &CounterSpec, window: &Window) -> String {
        self.scope.published_values(&spec.name, window.start_ms)
    }

    /// The cells of a published window, read again: those whose answer changed are corrected,
    /// or with `late = "drop"` dropped ([`late`]).
    pub(super) async fn late_changes(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        cells: Vec<Cell>,
        wm: i64,
    ) -> Result<(), PublishError> {
        let output = spec
            .output
            .as_ref()
            .expect("called for counters with an output");
        if output.late == OutputLate::Correct {
            return self
                .emit_changes(conn, spec, window, cells, wm, Emit::Correction)
                .await;
        }
        let hash = self.values_hash(spec, window);
        let dropper = late::Dropper {
            kafka: self.kafka,
            metrics: self.metrics,
            hash: &hash,
        };
        dropper.drop_changes(conn, spec, window, cells).await
    }

    /// Produce the cells of `cells` whose value differs from what was published for the window
    /// (all of them if nothing was).
    pub(super) async fn emit_changes(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        cells: Vec<Cell>,
        wm: i64,
        how: Emit,
    ) -> Result<(), PublishError> {
        if cells.is_empty() {
            return Ok(());
        }
        let hash = self.values_hash(spec, window);
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&hash);
        for c in &cells {
            hmget.arg(&c.key);
        }
        let had: Vec<Option<String>> = conn.query(&hmget).await?;
        let changed: Vec<Cell> = cells
            .into_iter()
            .zip(had)
            .filter(|(c, had)| had.as_deref() != Some(c.answer().as_str()))
            .map(|(c, _)| c)
            .collect();
        self.emit(conn, spec, window, &changed, wm, how).await
    }

    /// Publish the closed `window`: its write-ahead [`snapshot`] (taken now from `cells` at the
    /// first attempt, read back at every later one) is produced and acknowledged by Kafka; the
    /// caller then records the progress. Returns the snapshot; None when another publisher (a
    /// former leader) published the window meanwhile: its corrections may be in the hash, which
    /// is then no snapshot to produce. The progress is read after the snapshot: a publisher
    /// advances it before it records any correction.
    pub(super) async fn emit_final(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        cells: &[Cell],
        wm: i64,
        progress_key: &str,
    ) -> Result<Option<snapshot::Taken>, PublishError> {
        let hash = self.values_hash(spec, window);
        let closed_by = snapshot::start(conn, spec, window, &hash, wm, Emit::Final).await?;
        let taken = snapshot::take(conn, spec, window, &hash, cells).await?;
        let progress = progress::read(conn, progress_key).await?;
        if progress.is_some_and(|p| p >= window.end_ms) {
            return Ok(None);
        }
        if spec.output.as_ref().is_some_and(|o| o.tombstones) {
            tombstones::note(conn, spec, window, progress_key).await?;
        }
        if taken.again {
            self.metrics
                .publish
                .republished
                .with_label_values(&[&spec.name])
                .inc();
        }
        for chunk in taken.cells.chunks(10_000) {
            self.produce(spec, window, chunk, closed_by, Emit::Final)
                .await?;
        }
        self.count_records(spec, Emit::Final, taken.cells.len());
        Ok(Some(taken))
    }

    /// Produce `cells` of `window` (a correction or an update), wait for Kafka's
    /// acknowledgement of every record, then record the values as published.
    pub(super) async fn emit(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        window: &Window,
        cells: &[Cell],
        wm: i64,
        how: Emit,
    ) -> Result<(), PublishError> {
        if cells.is_empty() {
            return Ok(());
        }
        if how == Emit::Correction {
            self.metrics
                .publish
                .corrections
                .with_label_values(&[&spec.name])
                .inc_by(cells.len() as u64);
        }
        let hash = self.values_hash(spec, window);
        let closed_by = snapshot::start(conn, spec, window, &hash, wm, how).await?;
        for chunk in cells.chunks(10_000) {
            self.produce(spec, window, chunk, closed_by, how).await?;
            let open = how == Emit::Update;
            snapshot::record(conn, spec, window, &hash, chunk, open).await?;
        }
        self.count_records(spec, how, cells.len());
        Ok(())
    }

    /// Produce `cells` of `window` to the counter's topic and wait for Kafka's acknowledgement
    /// of every record.
    async fn produce(
        &self,
        spec: &CounterSpec,
        window: &Window,
        cells: &[Cell],
        closed_by: i64,
        how: Emit,
    ) -> Result<(), PublishError> {
        let output = spec
            .output
            .as_ref()
            .expect("called for counters with an output");
        let payloads: Vec<String> = cells
            .iter()
            .map(|c| record::value(spec, window, c, closed_by, how))
            .collect();
        // The record's time is its window's end, as Kafka Streams and Flink stamp a window's
        // result: a consumer joining on time sees when the window closed.
        let records = cells.iter().zip(&payloads).map(|(c, payload)| Outgoing {
            key: &c.key,
            payload: Some(payload),
            headers: None,
            timestamp: window.end_ms,
        });
        Ok(self.kafka.send(&output.topic, records.collect()).await?)
    }

    fn count_records(&self, spec: &CounterSpec, how: Emit, n: usize) {
        self.metrics
            .publish
            .records
            .with_label_values(&[&spec.name, how.label()])
            .inc_by(n as u64);
    }
}
