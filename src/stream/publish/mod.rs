//! Window results downstream: the final value of every key of each closed window, produced to
//! the counter's output topic.
//!
//! * [`watermark`]: per partition, the highest event time applied is recorded by the flush
//!   script with the applied offset (same fenced call); the topic watermark is the least over the
//!   partitions that are not idle. A window closes when that, minus the counter's
//!   `allowed_lateness`, has reached its end.
//! * [`cells`]: a counter's keys, found with SCAN and decoded into (window, dimensions).
//! * [`record`]: the record of one key (its Kafka key and JSON value).
//! * [`snapshot`]: the write-ahead snapshot of a closing window, the answers its final records
//!   carry.
//! * [`late`]: `late = "drop"`, the late changes of published windows counted, not corrected.
//! * [`tombstones`]: null records for the keys of windows whose keys expired.
//! * [`kafka`]: the producer, metadata and admin clients; [`topics`]: missing topics created.
//! * [`progress`]: per counter, the end of the last window published, and how far behind it is.
//!
//! One replica at a time publishes (the jobs' leadership, [`crate::jobs`]). Per counter it keeps
//! its progress in Redis (the end of the last window published), and per window the answers it
//! published (a hash expiring with the window's keys). At a window's first final attempt its
//! answers are recorded in that hash before anything is produced (the snapshot); every attempt
//! produces the snapshot, byte for byte the same (the watermark in a record is the one stored
//! at the first attempt), and the progress moves only after Kafka acknowledged every record. A
//! publisher killed mid-publish, or a send whose outcome is unknown, leaves the window
//! unpublished and the next attempt produces the same records again, even if a late event
//! changed a key in between. A key whose answer differs from the one published (a late event
//! within retention) is produced again with `"correction": true`, or with `late = "drop"`
//! counted and left out ([`late`]).
//!
//! A topic that cannot be created or written is logged at ERROR at once (then at most every
//! 10 s), and the windows it holds back show in `tally_publish_behind_seconds`: measured from
//! the oldest closed window not published, it grows from the first one, even when nothing was
//! ever published. Each counter is published on its own: one counter's broken topic does not
//! hold back another's.

pub mod cells;
mod emit;
mod error;

pub use error::PublishError;
pub mod kafka;
pub mod late;
pub mod progress;
pub mod record;
pub mod snapshot;
pub mod tombstones;
pub mod topics;
pub mod watermark;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tally_counters::config::{OutputLate, OutputWhen};
use tally_counters::conn::Conn;
use tally_counters::model::CounterSpec;
use tally_counters::request::Client;
use tally_counters::window::Window;

use crate::config::Model;
use crate::ops::metrics::Metrics;
use cells::Cell;
use kafka::Kafka;
use record::Emit;
use topics::{TopicAlarm, TopicError};
use watermark::{Mark, TopicPartition};

/// The publisher, built once per process; [`Publisher::pass`] runs under the leadership.
pub struct Publisher {
    model: Arc<Model>,
    client: Client,
    kafka: Kafka,
    metrics: Metrics,
    /// Per counter index: when its published windows were last read for corrections.
    last_scan: Mutex<BTreeMap<usize, Instant>>,
    /// Topic errors, logged at ERROR at once and then rate limited.
    alarm: TopicAlarm,
    /// What the last pass saw, for status pages: per partition, and per counter its watermark.
    pub state: Arc<Mutex<Snapshot>>,
}

/// The publisher's last view (program state, beside the metrics).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Per partition of every topic: what Redis and Kafka hold, and whether it is idle.
    pub partitions: BTreeMap<TopicPartition, (Mark, bool)>,
    /// Per counter name: its watermark after lateness (Unix ms), if known.
    pub counters: BTreeMap<String, Option<i64>>,
}

impl Publisher {
    /// The publisher of `model`'s counters with an output.
    pub fn new(
        model: Arc<Model>,
        client: &Client,
        metrics: &Metrics,
    ) -> Result<Self, PublishError> {
        let kafka = Kafka::new(&model)?;
        Ok(Publisher {
            model,
            client: client.clone(),
            kafka,
            metrics: metrics.clone(),
            last_scan: Mutex::new(BTreeMap::new()),
            alarm: TopicAlarm::default(),
            state: Arc::default(),
        })
    }

    /// One pass: read the watermarks, then for every counter with an output publish the windows
    /// that closed and the corrections found. A counter that fails does not stop the others;
    /// the pass returns the first error. Topic errors are logged here, at ERROR (rate limited).
    pub async fn pass(&self) -> Result<(), PublishError> {
        let mut first_error: Option<PublishError> = None;
        // Whether the topics exist, checked when the first counter has something to produce.
        let mut ready = None;
        let mut conn = self.client.conn().await?;
        let marks = watermark::read(&self.model, &mut conn, &self.kafka.consumer).await?;
        let now = redis_now_ms(&mut conn).await?;
        let quiet = self
            .model
            .counters
            .iter()
            .filter_map(|c| c.output.as_ref().map(|o| o.idle_timeout))
            .min()
            .unwrap_or(Duration::MAX);
        self.observe(&marks, now, quiet);
        for (i, spec) in self.model.counters.iter().enumerate() {
            let Some(output) = &spec.output else { continue };
            let topics = &self.model.topics;
            let raw = watermark::counter_watermark(&marks, topics, i, now, output.idle_timeout);
            let lateness = output.allowed_lateness.as_millis() as i64;
            let wm = raw.map(|t| t.saturating_sub(lateness));
            self.state.lock().counters.insert(spec.name.clone(), wm);
            self.metrics.status.counter_watermark(&spec.name, wm);
            let result = self.counter(&mut conn, i, spec, wm, now, &mut ready).await;
            if let Err(e) = result {
                if let PublishError::Topic(topic) = &e {
                    self.alarm.report(topic);
                }
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Counter `index`'s part of a pass, `wm` its watermark: its windows, then its tombstones
    /// (none is due before the window is published, and no correction is produced once it is
    /// due). `topics`: see [`Publisher::topics_ready`].
    async fn counter(
        &self,
        conn: &mut Conn,
        index: usize,
        spec: &CounterSpec,
        wm: Option<i64>,
        now: i64,
        topics: &mut Option<bool>,
    ) -> Result<(), PublishError> {
        if let Some(wm) = wm {
            self.metrics
                .publish
                .counter_watermark_seconds
                .with_label_values(&[&spec.name])
                .set(wm as f64 / 1000.0);
            self.counter_pass(conn, index, spec, wm, now, topics)
                .await?;
        }
        let tombstones = spec.output.as_ref().is_some_and(|o| o.tombstones);
        if tombstones && self.topics_ready(topics).await? {
            let hash_of = |start| self.model.scope.published_values(&spec.name, start);
            let tombstoner = tombstones::Tombstoner {
                kafka: &self.kafka,
                metrics: &self.metrics,
                hash_of: &hash_of,
            };
            let progress_key = self.model.scope.publish_progress(&spec.name);
            tombstoner.pass(conn, spec, &progress_key, now).await?;
        }
        Ok(())
    }

    /// Whether the topics the publisher writes exist (created if missing, with
    /// `create_topics`), checked once per pass (`checked`), only when a counter is about to
    /// produce: a creation that hangs does not delay how far behind each counter is measured.
    /// The pass's first check fails with the reason; later ones say false.
    async fn topics_ready(&self, checked: &mut Option<bool>) -> Result<bool, TopicError> {
        if let Some(ready) = *checked {
            return Ok(ready);
        }
        let result = self.kafka.ensure_topics(&self.model).await;
        *checked = Some(result.is_ok());
        result.map(|()| true)
    }

    /// The leadership ended: the gauges only the leader updates go back to 0, so that a former
    /// leader does not report a lag it no longer watches.
    pub fn step_down(&self) {
        for spec in self.model.counters.iter().filter(|c| c.output.is_some()) {
            let behind = &self.metrics.publish.behind_seconds;
            behind.with_label_values(&[&spec.name]).set(0);
        }
        self.metrics.status.clear_watermarks();
    }

    /// The producer of window results, borrowing this publisher's parts.
    fn emitter(&self) -> emit::Emitter<'_> {
        emit::Emitter {
            kafka: &self.kafka,
            metrics: &self.metrics,
            scope: &self.model.scope,
        }
    }

    /// Metrics and state of the partitions (idle as seen with the shortest `idle_timeout`).
    fn observe(&self, marks: &BTreeMap<TopicPartition, Mark>, now: i64, quiet: Duration) {
        let mut state = self.state.lock();
        state.partitions.clear();
        for (tp, mark) in marks {
            let topic = self.model.topics[tp.topic].name.as_str();
            let labels = [topic, &tp.partition.to_string()];
            let idle = mark.idle(now, quiet);
            if let Some(t) = mark.max_event_ms {
                self.metrics
                    .publish
                    .watermark_seconds
                    .with_label_values(&labels)
                    .set(t as f64 / 1000.0);
            }
            self.metrics
                .publish
                .idle
                .with_label_values(&labels)
                .set(i64::from(idle));
            state.partitions.insert(*tp, (*mark, idle));
        }
        let marks = state.partitions.iter().map(|(tp, (mark, idle))| {
            let topic = self.model.topics[tp.topic].name.as_str();
            (topic, tp.partition, mark.max_event_ms, *idle)
        });
        self.metrics.status.partition_watermarks(marks);
    }

    /// One counter: publish its windows that closed (up to `wm`), look for corrections, and
    /// in `updates` mode publish the changes of its open windows (`now`: Redis' clock). How
    /// far behind it is is measured first, whether its topics can be written or not.
    async fn counter_pass(
        &self,
        conn: &mut Conn,
        index: usize,
        spec: &CounterSpec,
        wm: i64,
        now: i64,
        topics: &mut Option<bool>,
    ) -> Result<(), PublishError> {
        let output = spec
            .output
            .as_ref()
            .expect("called for counters with an output");
        let scope = &self.model.scope;
        let progress_key = scope.publish_progress(&spec.name);
        let progress = progress::read(conn, &progress_key).await?;
        // Every window ending at or before the start of the window holding `wm` is closed.
        let closed_end = spec.window.window_of(wm).start_ms;
        let behind = self
            .metrics
            .publish
            .behind_seconds
            .with_label_values(&[&spec.name]);
        let closing = progress.is_none_or(|p| p < closed_end);
        let updates = output.when == OutputWhen::Updates;
        let rescan = self
            .last_scan
            .lock()
            .get(&index)
            .is_none_or(|at| at.elapsed() >= self.model.config.jobs.publish.corrections_every);
        if !closing {
            behind.set(0);
        }
        if !closing && !rescan && !updates {
            return Ok(());
        }
        let found = cells::scan(conn, spec).await?;
        let ends = found.values().map(|(window, _)| window.end_ms);
        behind.set(progress::behind_seconds(ends, progress, closed_end, wm));
        if !self.topics_ready(topics).await? {
            return Ok(());
        }
        self.last_scan.lock().insert(index, Instant::now());
        for (window, keys) in found.values() {
            let cells = cells::read(conn, spec, window, keys).await?;
            if window.end_ms > closed_end {
                if updates {
                    self.emitter()
                        .emit_changes(conn, spec, window, cells, wm, Emit::Update)
                        .await?;
                }
            } else if progress.is_some_and(|p| window.end_ms <= p) {
                // Expired (nothing more is counted into it): its tombstones may be out, and
                // no correction may follow them.
                if output.tombstones && spec.expire_at(window.end_ms) <= now {
                    continue;
                }
                self.emitter()
                    .late_changes(conn, spec, window, cells, wm)
                    .await?;
            } else {
                self.close_window(
                    conn,
                    spec,
                    (window, keys.as_slice()),
                    cells,
                    wm,
                    &progress_key,
                )
                .await?;
            }
        }
        if closing {
            progress::advance(conn, &progress_key, closed_end).await?;
            behind.set(0);
        }
        Ok(())
    }

    /// A window that closed and was not published yet: its final results, the counter's
    /// progress moved past it, then the corrections a re-publish found.
    async fn close_window(
        &self,
        conn: &mut Conn,
        spec: &CounterSpec,
        (window, keys): (&Window, &[Vec<u8>]),
        cells: Vec<Cell>,
        wm: i64,
        progress_key: &str,
    ) -> Result<(), PublishError> {
        let emitter = self.emitter();
        let attempt = emitter.emit_final(conn, spec, window, &cells, wm, progress_key);
        // None: another publisher finished it meanwhile.
        let Some(taken) = attempt.await? else {
            return Ok(());
        };
        self.metrics
            .publish
            .windows
            .with_label_values(&[&spec.name])
            .inc();
        progress::advance(conn, progress_key, window.end_ms).await?;
        if taken.again {
            // A re-publish: a late event since the first attempt (even one during this
            // attempt's sends) makes a key differ from the snapshot; read the keys again
            // now that Kafka acknowledged, and correct (or drop) those.
            let current = cells::read(conn, spec, window, keys).await?;
            let late_drop = spec
                .output
                .as_ref()
                .is_some_and(|o| o.late == OutputLate::Drop);
            if late_drop {
                self.emitter()
                    .late_changes(conn, spec, window, current, wm)
                    .await?;
            } else {
                let late = snapshot::changed_since(&taken.cells, current);
                self.emitter()
                    .emit(conn, spec, window, &late, wm, Emit::Correction)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Redis' clock (the one `seen:` times are written with), Unix ms.
async fn redis_now_ms(conn: &mut Conn) -> Result<i64, PublishError> {
    let (secs, micros): (i64, i64) = conn.query(&redis::cmd("TIME")).await?;
    Ok(secs * 1000 + micros / 1000)
}
