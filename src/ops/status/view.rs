//! The answer of `GET /v1/status`: one JSON document the page and `tally top` draw.

use std::sync::atomic::Ordering;

use serde::Serialize;
use utoipa::ToSchema;

use super::{HotKey, Status};
use crate::ops::health::Health;

/// Hot keys shown.
const TOP_KEYS: usize = 10;

/// The process' live status.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusAnswer {
    /// `run` (consumes Kafka) or `serve` (request path only).
    pub mode: &'static str,
    /// Which process this is.
    pub instance: InstanceView,
    /// Seconds since the process started.
    pub uptime_s: u64,
    /// Readiness and its parts.
    pub health: HealthView,
    /// The stream path; absent under `tally serve`.
    pub stream: Option<StreamView>,
    /// Rate-limit decisions per policy, by name.
    pub requests: Vec<PolicyView>,
    /// Jobs led by one replica at a time.
    pub jobs: Vec<JobView>,
}

/// Which process answers: enough to tell replicas and versions apart.
#[derive(Debug, Serialize, ToSchema)]
pub struct InstanceView {
    /// The host name (a pod's name under Kubernetes).
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// tally's version and the git commit it was built from (`tally version`).
    pub version: String,
    pub commit: String,
    /// The consumer group and topic counted; absent under `tally serve`.
    pub group: Option<String>,
    pub topic: Option<String>,
}

/// Readiness, as `/health/ready` decides it.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthView {
    /// Ready to serve (Kafka reachable, Redis usable, nothing halted).
    pub ready: bool,
    /// A Kafka broker was reachable lately; absent under `tally serve`.
    pub kafka: Option<bool>,
    /// Redis answered the last request.
    pub redis: bool,
    /// `/health/ready`'s text.
    pub detail: String,
}

/// The stream path.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamView {
    /// Every partition this process owns, by number.
    pub partitions: Vec<PartitionView>,
    /// Sum of the partitions' lag.
    pub lag: i64,
    /// Halted or waiting partitions, each with what to run.
    pub halted: Vec<HaltView>,
    /// Messages read per second (mean of the last 5 s).
    pub consumed_per_s: f64,
    /// Keys written per second by landed flushes (mean of the last 5 s).
    pub flushed_keys_per_s: f64,
    /// Flushes landed per second (mean of the last 5 s).
    pub flushes_per_s: f64,
    /// Per second, oldest first, up to a minute.
    pub sparklines: Sparklines,
    /// Totals since the start.
    pub totals: TotalsView,
    /// Time from sending a flush to its answer, over the last 256 flushes.
    pub flush_latency_ms: LatencyView,
    /// The hottest keys; absent when `status.hot_keys = 0`.
    pub hot_keys: Option<HotKeysView>,
    /// Per counter with an output, its watermark: windows ending at or before it are closed
    /// and published. Listed on the replica leading the window publisher only.
    pub outputs: Vec<OutputView>,
}

/// The watermark of one counter with an output.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputView {
    pub counter: String,
    /// The topic's watermark minus the counter's `allowed_lateness` (Unix ms); null until every
    /// partition that is not idle has shown an event time.
    pub watermark: Option<i64>,
}

/// One owned partition.
#[derive(Debug, Serialize, ToSchema)]
pub struct PartitionView {
    /// The topic.
    pub topic: String,
    pub partition: i32,
    /// The consumer lane that owns it.
    pub lane: usize,
    /// Next offset to count (everything before landed in Redis).
    pub applied: Option<i64>,
    /// Kafka's end offset (high watermark), asked of the broker every `kafka.lag_interval`.
    pub end: Option<i64>,
    /// `end - applied`: messages not yet counted.
    pub lag: Option<i64>,
    /// Age of the oldest message not yet counted, in seconds (0 without a backlog).
    pub lag_seconds: Option<f64>,
    /// The highest event time applied (Unix ms): the partition's event-time watermark before
    /// `allowed_lateness`. Known on the replica that leads the window publisher (`jobs.publish`),
    /// null elsewhere and without counter outputs.
    pub watermark: Option<i64>,
    /// Idle: caught up and quiet for `idle_timeout`, so it does not hold the topic's watermark
    /// back. Null where `watermark` is unknown.
    pub idle: Option<bool>,
    /// Whether it is halted or waiting (see `halted`).
    pub halted: bool,
    /// The partition reopened behind where it was (Redis took its applied offset back, or
    /// refused a unit): it is being replayed from Kafka up to this offset, and tally is not
    /// ready until then.
    pub replaying_until: Option<i64>,
}

/// A halted partition.
#[derive(Debug, Serialize, ToSchema)]
pub struct HaltView {
    /// The topic.
    pub topic: String,
    pub partition: i32,
    pub lane: usize,
    /// `fence_missing`, `fence_corrupt`, `state_lost`, `beyond_end`, `redis_unavailable`,
    /// `kafka_unavailable`.
    pub reason: &'static str,
    /// What happened and what to do.
    pub detail: String,
    /// The command that repairs it; absent when it resumes by itself (waiting on Redis or Kafka).
    pub repair: Option<String>,
}

/// Per-second series.
#[derive(Debug, Serialize, ToSchema)]
pub struct Sparklines {
    pub consumed: Vec<u64>,
    pub flushed_keys: Vec<u64>,
}

/// Totals since the start.
#[derive(Debug, Serialize, ToSchema)]
pub struct TotalsView {
    pub consumed: u64,
    pub flushed_keys: u64,
    pub flushes: u64,
    /// Messages not counted because they could not be decoded (`tally_decode_errors_total`).
    pub invalid: u64,
    /// Events not counted because their window had expired (`tally_late_events_total`).
    pub late: u64,
}

/// Percentiles of the last flushes.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatencyView {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// Flushes the percentiles are over.
    pub samples: usize,
}

/// The heavy-hitters summary.
#[derive(Debug, Serialize, ToSchema)]
pub struct HotKeysView {
    /// Keys held at most.
    pub capacity: usize,
    /// A shown count is at most this much below the key's true sum.
    pub error_bound: u64,
    /// Sum of every delta summarised.
    pub total: u64,
    /// Heaviest first.
    pub keys: Vec<HotKey>,
}

/// One rate-limit policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    pub policy: String,
    pub admitted: u64,
    pub denied: u64,
    /// Decided without Redis (by `on_redis_error`); included in admitted or denied.
    pub without_redis: u64,
}

/// One job.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub job: String,
    /// This replica leads it now.
    pub leader: bool,
    /// Passes that succeeded here.
    pub runs: u64,
    /// Unix ms of the last pass here.
    pub last_run_ms: Option<i64>,
    /// The last pass' error, if it failed.
    pub last_error: Option<String>,
}

impl Status {
    /// The answer, with readiness from `health`; `stream` says whether this process consumes.
    pub fn view(&self, health: &Health, stream: bool) -> StatusAnswer {
        let consuming = self.consuming.lock().clone();
        StatusAnswer {
            mode: if stream { "run" } else { "serve" },
            instance: InstanceView {
                host: host_name(),
                pid: std::process::id(),
                version: crate::ops::build_info::VERSION.to_string(),
                commit: crate::ops::build_info::COMMIT.to_string(),
                group: consuming.as_ref().map(|c| c.0.clone()),
                topic: consuming.map(|c| c.1),
            },
            uptime_s: self.started.elapsed().as_secs(),
            health: HealthView {
                ready: health.ready(),
                kafka: (!health.without_kafka).then(|| health.kafka.is_reachable()),
                redis: health.redis.load(Ordering::Relaxed),
                detail: health.describe(),
            },
            stream: stream.then(|| self.stream_view()),
            requests: self
                .requests
                .lock()
                .iter()
                .map(|(policy, d)| PolicyView {
                    policy: policy.clone(),
                    admitted: d.admitted,
                    denied: d.denied,
                    without_redis: d.without_redis,
                })
                .collect(),
            jobs: self
                .jobs
                .lock()
                .iter()
                .map(|(job, j)| JobView {
                    job: (*job).to_string(),
                    leader: j.leader,
                    runs: j.runs,
                    last_run_ms: j.last_run_ms,
                    last_error: j.last_error.clone(),
                })
                .collect(),
        }
    }

    fn stream_view(&self) -> StreamView {
        let stream = &self.stream;
        let prefix = self.command_prefix.lock().clone();
        let marks = stream.watermarks.lock().clone();
        let mut partitions = Vec::new();
        let mut halted = Vec::new();
        for ((topic, partition), p) in stream.partitions.lock().iter() {
            let mark = marks.partitions.get(&(topic.clone(), *partition));
            partitions.push(partition_view(topic, *partition, p, mark));
            halted.extend(halt_view(topic, *partition, p, &prefix));
        }
        let history = stream.history.lock();
        let latencies = stream.latencies.lock();
        let totals = stream.totals.read();
        StreamView {
            lag: partitions.iter().filter_map(|p| p.lag).sum(),
            partitions,
            halted,
            consumed_per_s: history.rate(5, |r| r.consumed),
            flushed_keys_per_s: history.rate(5, |r| r.flushed_keys),
            flushes_per_s: history.rate(5, |r| r.flushes),
            sparklines: Sparklines {
                consumed: history.series(|r| r.consumed),
                flushed_keys: history.series(|r| r.flushed_keys),
            },
            totals: TotalsView {
                consumed: totals.consumed,
                flushed_keys: totals.flushed_keys,
                flushes: totals.flushes,
                invalid: stream.totals.invalid.load(Ordering::Relaxed),
                late: stream.totals.late.load(Ordering::Relaxed),
            },
            flush_latency_ms: LatencyView {
                p50: latencies.quantile_ms(0.5),
                p99: latencies.quantile_ms(0.99),
                samples: latencies.samples(),
            },
            hot_keys: stream.hot.as_ref().map(|hot| {
                let hot = hot.lock();
                HotKeysView {
                    capacity: hot.capacity(),
                    error_bound: hot.error_bound(),
                    total: hot.total(),
                    keys: hot.top(TOP_KEYS, super::unix_ms()),
                }
            }),
            outputs: marks
                .counters
                .into_iter()
                .map(|(counter, watermark)| OutputView { counter, watermark })
                .collect(),
        }
    }
}

/// Partition `partition` of `topic`: its progress, and the publisher's watermark `mark`.
fn partition_view(
    topic: &str,
    partition: i32,
    p: &super::Partition,
    mark: Option<&(Option<i64>, bool)>,
) -> PartitionView {
    // The end is asked every `kafka.lag_interval`: when the applied offset passed it since,
    // the probe is behind, not the partition.
    let end = match (p.applied, p.end) {
        (Some(a), Some(e)) => Some(e.max(a)),
        (_, e) => e,
    };
    PartitionView {
        topic: topic.to_string(),
        partition,
        lane: p.lane,
        applied: p.applied,
        end,
        lag: p.applied.zip(end).map(|(a, e)| e - a),
        lag_seconds: p.lag_seconds,
        watermark: mark.and_then(|m| m.0),
        idle: mark.map(|m| m.1),
        halted: p.halt.is_some(),
        replaying_until: p.replaying_until,
    }
}

/// Why partition `partition` of `topic` is halted, if it is, and the command (after `prefix`)
/// that repairs it.
fn halt_view(topic: &str, partition: i32, p: &super::Partition, prefix: &str) -> Option<HaltView> {
    let h = p.halt.as_ref()?;
    Some(HaltView {
        topic: topic.to_string(),
        partition,
        lane: p.lane,
        reason: h.reason,
        detail: h.detail.clone(),
        repair: h.repair.as_ref().map(|args| format!("{prefix} {args}")),
    })
}

/// The host's name (Linux: the kernel's; elsewhere `HOSTNAME`), or `unknown`; read once.
fn host_name() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown".into())
    })
    .clone()
}
