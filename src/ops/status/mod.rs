//! The live status behind `GET /v1/status`, the page at `GET /` and `tally top`: what the
//! stages report about themselves, kept in process (no Prometheus needed, and no metric is
//! read back). The stages write per batch: a lane's offsets when a flush lands, its halted
//! partitions when they change, Kafka's end offsets with librdkafka's statistics, the request
//! path's decisions per call, the jobs' leadership per pass. A sampler turns the stream's
//! totals into a one-minute history every second ([`Status::sample`]). [`view`] assembles the
//! answer.
//!
//! Files: `rates.rs` (totals, the history, flush latencies), `hot.rs` (the heavy-hitters
//! summary), `view.rs` (the JSON answer).

mod hot;
mod rates;
pub mod view;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

pub use hot::{HotKey, HotKeys};
pub use rates::{History, Latencies, Totals, HISTORY};

/// What one partition of the stream looks like.
#[derive(Debug, Clone, Default)]
struct Partition {
    /// The consumer lane that owns it.
    lane: usize,
    /// Next offset to count: everything before has landed in Redis.
    applied: Option<i64>,
    /// Kafka's end of the partition (high watermark), from the lag probe.
    end: Option<i64>,
    /// Age of the oldest message not yet counted, in seconds (the lag probe).
    lag_seconds: Option<f64>,
    /// Why it is halted or waiting, if it is.
    halt: Option<HaltedPartition>,
    /// Being replayed from Kafka up to this offset, after Redis took its applied offset back.
    replaying_until: Option<i64>,
}

/// A halted (or waiting) partition.
#[derive(Debug, Clone)]
pub struct HaltedPartition {
    /// The reason's label (as `tally_partitions_halted{reason}`).
    pub reason: &'static str,
    /// What happened and what to do.
    pub detail: String,
    /// The `tally state repair` arguments that fix it, if an operator must act.
    pub repair: Option<String>,
}

/// Rate-limit decisions of one policy.
#[derive(Debug, Clone, Copy, Default)]
struct Decisions {
    admitted: u64,
    denied: u64,
    /// Decided by the policy's `on_redis_error` (counted in admitted or denied too).
    without_redis: u64,
}

/// A job's leadership and last run.
#[derive(Debug, Clone, Default)]
struct Job {
    leader: bool,
    runs: u64,
    /// Unix ms of the last pass, and its error if it failed.
    last_run_ms: Option<i64>,
    last_error: Option<String>,
}

/// The stream's state: partitions, totals, history, flush latencies, hot keys.
#[derive(Debug)]
struct Stream {
    /// By (topic, partition): fences, and so everything here, are per topic-partition.
    partitions: Mutex<BTreeMap<(String, i32), Partition>>,
    /// The topic each consumer lane reads, by lane.
    lanes: Mutex<Vec<String>>,
    totals: Totals,
    history: Mutex<History>,
    latencies: Mutex<Latencies>,
    /// None when `status.hot_keys = 0`.
    hot: Option<Mutex<HotKeys>>,
    /// Event-time watermarks, as the publishing leader last read them (empty elsewhere).
    watermarks: Mutex<Watermarks>,
}

/// What the window publisher last saw ([`crate::stream::publish`]); kept while this process leads it.
#[derive(Debug, Clone, Default)]
struct Watermarks {
    /// Per (topic, partition): the highest event time applied (Unix ms), and whether the
    /// partition is idle (not holding the topic's watermark back).
    partitions: BTreeMap<(String, i32), (Option<i64>, bool)>,
    /// Per counter with an output: its watermark after `allowed_lateness` (Unix ms).
    counters: BTreeMap<String, Option<i64>>,
}

/// The process' live status.
#[derive(Debug)]
pub struct Status {
    /// For the uptime.
    started: Instant,
    stream: Stream,
    /// Rate-limit decisions per policy (names from the configuration: bounded).
    requests: Mutex<BTreeMap<String, Decisions>>,
    jobs: Mutex<BTreeMap<&'static str, Job>>,
    /// What the repair command needs besides its own arguments (`--config <file>`).
    command_prefix: Mutex<String>,
    /// The consumer group and topic of `tally run` (unset under `tally serve`).
    consuming: Mutex<Option<(String, String)>>,
}

impl Status {
    /// An empty status; `hot_keys` is the heavy-hitters summary's capacity (0: none).
    pub fn new(hot_keys: usize) -> Status {
        Status {
            started: Instant::now(),
            stream: Stream {
                partitions: Mutex::new(BTreeMap::new()),
                lanes: Mutex::new(Vec::new()),
                totals: Totals::default(),
                history: Mutex::new(History::default()),
                latencies: Mutex::new(Latencies::default()),
                hot: (hot_keys > 0).then(|| Mutex::new(HotKeys::new(hot_keys))),
                watermarks: Mutex::default(),
            },
            requests: Mutex::new(BTreeMap::new()),
            jobs: Mutex::new(BTreeMap::new()),
            command_prefix: Mutex::new("tally state".into()),
            consuming: Mutex::new(None),
        }
    }

    /// Name the configuration file in repair commands (`tally state --config <path> repair …`).
    pub fn set_config_path(&self, path: &std::path::Path) {
        *self.command_prefix.lock() = format!("tally state --config {}", path.display());
    }

    /// Say which consumer group and topic this process counts (shown with its identity).
    pub fn set_consuming(&self, group: &str, topic: &str) {
        *self.consuming.lock() = Some((group.to_string(), topic.to_string()));
    }

    // ---- the stream path (consumer lanes) ----

    /// Consumer lane `lane` reads `topic` (called as it starts, before it owns partitions).
    pub fn lane_reads(&self, lane: usize, topic: &str) {
        let mut lanes = self.stream.lanes.lock();
        if lanes.len() <= lane {
            lanes.resize(lane + 1, String::new());
        }
        lanes[lane] = topic.to_string();
    }

    /// The (topic, partition) of `partition` of `lane`'s topic.
    fn of_lane(&self, lane: usize, partition: i32) -> (String, i32) {
        let lanes = self.stream.lanes.lock();
        (lanes.get(lane).cloned().unwrap_or_default(), partition)
    }

    /// `partition` was assigned to `lane` and starts at `start`.
    pub fn assigned(&self, lane: usize, partition: i32, start: i64) {
        let key = self.of_lane(lane, partition);
        let mut parts = self.stream.partitions.lock();
        let p = parts.entry(key).or_default();
        p.lane = lane;
        p.applied = Some(start);
    }

    /// `partition` of `lane`'s topic left this process.
    pub fn revoked(&self, lane: usize, partition: i32) {
        let key = self.of_lane(lane, partition);
        self.stream.partitions.lock().remove(&key);
    }

    /// A flush of `lane` landed: `ends` are the partitions' new applied offsets; it wrote
    /// `keys` keys in `took`.
    pub fn flush_landed(
        &self,
        lane: usize,
        ends: impl IntoIterator<Item = (i32, i64)>,
        keys: usize,
        took: Duration,
    ) {
        {
            let topic = self.of_lane(lane, 0).0;
            let mut parts = self.stream.partitions.lock();
            for (partition, end) in ends {
                if let Some(p) = parts.get_mut(&(topic.clone(), partition)) {
                    p.applied = Some(end);
                }
            }
        }
        let totals = &self.stream.totals;
        totals
            .flushed_keys
            .fetch_add(keys as u64, Ordering::Relaxed);
        totals.flushes.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.stream.latencies.lock().push(micros);
    }

    /// The partitions this process owns, by topic, with the next offset to count where known.
    pub fn owned(&self) -> BTreeMap<String, Vec<(i32, Option<i64>)>> {
        let parts = self.stream.partitions.lock();
        let mut owned: BTreeMap<String, Vec<(i32, Option<i64>)>> = BTreeMap::new();
        for ((topic, p), s) in parts.iter() {
            owned
                .entry(topic.clone())
                .or_default()
                .push((*p, s.applied));
        }
        owned
    }

    /// The age of `partition`'s oldest message not yet counted (ignored if not owned).
    pub fn lag_seconds(&self, topic: &str, partition: i32, seconds: f64) {
        let key = (topic.to_string(), partition);
        if let Some(p) = self.stream.partitions.lock().get_mut(&key) {
            p.lag_seconds = Some(seconds);
        }
    }

    /// Kafka's end offset of `partition` (ignored for partitions this process does not own).
    pub fn kafka_end(&self, topic: &str, partition: i32, end: i64) {
        let key = (topic.to_string(), partition);
        if let Some(p) = self.stream.partitions.lock().get_mut(&key) {
            p.end = Some(end);
        }
    }

    /// `n` messages could not be decoded (not counted; dead-lettered when configured).
    pub fn invalid(&self, n: u64) {
        self.stream.totals.invalid.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` events came after their window expired (not counted).
    pub fn late(&self, n: u64) {
        self.stream.totals.late.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` messages were read.
    pub fn consumed(&self, n: u64) {
        self.stream.totals.consumed.fetch_add(n, Ordering::Relaxed);
    }

    /// Replace what `lane` reports as halted.
    pub fn set_halted(
        &self,
        lane: usize,
        halted: impl IntoIterator<Item = (i32, HaltedPartition)>,
    ) {
        let topic = self.of_lane(lane, 0).0;
        let mut parts = self.stream.partitions.lock();
        for p in parts.values_mut().filter(|p| p.lane == lane) {
            p.halt = None;
        }
        for (partition, halt) in halted {
            let p = parts.entry((topic.clone(), partition)).or_default();
            p.lane = lane;
            p.halt = Some(halt);
        }
    }

    /// Replace what `lane` reports as replaying after a rollback: (partition, replayed up to).
    pub fn set_replaying(&self, lane: usize, replaying: impl IntoIterator<Item = (i32, i64)>) {
        let topic = self.of_lane(lane, 0).0;
        let mut parts = self.stream.partitions.lock();
        for p in parts.values_mut().filter(|p| p.lane == lane) {
            p.replaying_until = None;
        }
        for (partition, until) in replaying {
            let p = parts.entry((topic.clone(), partition)).or_default();
            p.lane = lane;
            p.replaying_until = Some(until);
        }
    }

    /// A batch was sealed for a flush: feed its count deltas (already summed per key within a
    /// unit) to the heavy-hitters summary, once per flush, never per message; nothing is
    /// allocated or cloned per unit or key.
    /// `deltas` are `(key, delta, expire_at_ms)`; `repeats` is how many times one key can
    /// appear among them (the aggregator's `max_units_per_key`).
    pub fn sealed<'a, I>(&self, deltas: I, repeats: usize)
    where
        I: IntoIterator<Item = (&'a [u8], i64, i64)> + Clone,
    {
        let Some(hot) = &self.stream.hot else {
            return;
        };
        hot.lock().feed(deltas, repeats, unix_ms());
    }

    /// The window publisher read the partitions' `(topic, partition, highest event time,
    /// idle)`.
    pub fn partition_watermarks<'t>(
        &self,
        marks: impl IntoIterator<Item = (&'t str, i32, Option<i64>, bool)>,
    ) {
        let mut w = self.stream.watermarks.lock();
        w.partitions.clear();
        w.partitions.extend(
            marks
                .into_iter()
                .map(|(topic, p, t, idle)| ((topic.to_string(), p), (t, idle))),
        );
    }

    /// The window publisher computed `counter`'s watermark after lateness (None: not known yet).
    pub fn counter_watermark(&self, counter: &str, watermark: Option<i64>) {
        let mut w = self.stream.watermarks.lock();
        match w.counters.get_mut(counter) {
            Some(v) => *v = watermark,
            None => {
                w.counters.insert(counter.to_string(), watermark);
            }
        }
    }

    /// This process stopped publishing: its watermarks would go stale.
    pub fn clear_watermarks(&self) {
        *self.stream.watermarks.lock() = Watermarks::default();
    }

    /// Take a reading of the totals into the history; call once a second.
    pub fn sample(&self) {
        let now = self.stream.totals.read();
        self.stream.history.lock().push(now);
    }

    /// Sample every second until `stop`.
    pub async fn run_sampler(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => self.sample(),
            }
        }
    }

    // ---- the request path and the jobs ----

    /// A rate-limit decision of `policy`.
    pub fn decided(&self, policy: &str, allowed: bool, without_redis: bool) {
        let mut requests = self.requests.lock();
        let d = match requests.get_mut(policy) {
            Some(d) => d,
            None => requests.entry(policy.to_string()).or_default(),
        };
        if allowed {
            d.admitted += 1;
        } else {
            d.denied += 1;
        }
        if without_redis {
            d.without_redis += 1;
        }
    }

    /// `job` took or lost its leadership.
    pub fn job_leader(&self, job: &'static str, leader: bool) {
        self.jobs.lock().entry(job).or_default().leader = leader;
    }

    /// `job` ran a pass at `at_ms`.
    pub fn job_ran(&self, job: &'static str, at_ms: i64, error: Option<String>) {
        let mut jobs = self.jobs.lock();
        let j = jobs.entry(job).or_default();
        j.runs += u64::from(error.is_none());
        j.last_run_ms = Some(at_ms);
        j.last_error = error;
    }
}

impl Default for Status {
    fn default() -> Status {
        Status::new(0)
    }
}

pub use tally_counters::clock::unix_ms;
