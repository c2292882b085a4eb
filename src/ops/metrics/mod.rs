//! Every Prometheus metric tally exports, registered in one place on an explicit registry.
//!
//! Labels are bounded: counter name (from config), partition (topic size), error kind and
//! decode reason (closed enums). A user's key or dimension value is never a label.
//!
//! One struct per stage, each in its own file with its constructor beside the label enums it
//! uses, following the data: [`ConsumerMetrics`] (Kafka), [`DecodeMetrics`],
//! [`AggregateMetrics`], [`SinkMetrics`] (flushes), [`RedisMetrics`] (the stream path's
//! connection), [`RecoveryMetrics`], then [`RequestMetrics`] and [`JobMetrics`].

mod aggregate;
mod connections;
mod consumer;
mod decode;
mod jobs;
mod labels;
mod publish;
mod recovery;
mod redis;
mod request;
mod rlqs;
mod rls;
mod share;
mod sink;

pub use aggregate::AggregateMetrics;
pub use connections::{ConnectionMetrics, Refusal};
pub use consumer::{ConsumerMetrics, RebalanceKind};
pub use decode::DecodeMetrics;
pub use jobs::JobMetrics;
pub use publish::PublishMetrics;
pub use recovery::{HaltReason, RecoveryMetrics, ResetReason, Rollback};
pub use redis::{RedisErrorKind, RedisMetrics};
pub use request::{Outcome, Primitive, RequestMetrics};
pub use rlqs::{QuotaAction, QuotaSkip, ReportedOutcome, RlqsMetrics};
pub use rls::RlsMetrics;
pub use share::{GaugeShare, LaneGauges};
pub use sink::{RejectReason, SinkMetrics};

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// All metrics of one tally process.
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Messages read, offsets committed, rebalances, backpressure.
    pub consumer: ConsumerMetrics,
    /// Messages that could not be decoded.
    pub decode: DecodeMetrics,
    /// Events counted, late or replayed; keys pending.
    pub aggregate: AggregateMetrics,
    /// What the flushes wrote.
    pub sink: SinkMetrics,
    /// The stream path's Redis errors and retries.
    pub redis: RedisMetrics,
    /// Partitions halted, rebuilt or reset.
    pub recovery: RecoveryMetrics,
    /// The request path's metrics.
    pub request: RequestMetrics,
    /// The jobs' metrics.
    pub jobs: JobMetrics,
    /// Not Prometheus: the live status (`/v1/status`), which the stages write beside their
    /// metrics (per batch) and which is read as program state. It rides here because every stage
    /// already holds the metrics.
    pub status: std::sync::Arc<crate::ops::status::Status>,
    /// Envoy's rate limit service.
    pub rls: RlsMetrics,
    /// Watermarks and the window publisher.
    pub publish: PublishMetrics,
}

/// One metric family as the reference (`docs/reference/metrics.md`) documents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricDoc {
    /// The family's name, e.g. `tally_messages_consumed_total`.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The help text `/metrics` shows.
    pub help: String,
    /// The label names (their values are bounded: see the module's description).
    pub labels: Vec<String>,
}

/// Every family ever registered by [`Metrics::new`], by name: the definitions are static, so
/// what one process registers is what every process registers (an empty labelled family shows
/// here, though `/metrics` leaves it out until it has a series).
static CATALOG: Mutex<BTreeMap<String, MetricDoc>> = Mutex::new(BTreeMap::new());

/// Every metric family a tally process exports, sorted by name: the generated reference.
pub fn catalog() -> Vec<MetricDoc> {
    let _ = Metrics::new(&[]);
    let catalog = CATALOG.lock().unwrap_or_else(|p| p.into_inner());
    catalog.values().cloned().collect()
}

/// Register `c` (once; a second registration is a bug) and note its families in the catalog.
pub(super) fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    c: C,
    kind: &'static str,
) -> C {
    note(&c, kind);
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

/// Note `c`'s families in the catalog, as `kind` (`process`: the process collector's, whose one
/// counter says so by its name).
fn note(c: &dyn Collector, kind: &'static str) {
    let mut catalog = CATALOG.lock().unwrap_or_else(|p| p.into_inner());
    for d in c.desc() {
        let kind = match kind {
            "process" if d.fq_name.ends_with("_total") => "counter",
            "process" => "gauge",
            kind => kind,
        };
        let doc = MetricDoc {
            name: d.fq_name.clone(),
            kind,
            help: d.help.clone(),
            labels: d.variable_labels.clone(),
        };
        catalog.insert(d.fq_name.clone(), doc);
    }
}

pub(super) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    register(registry, c, "counter")
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    register(registry, c, "counter")
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    register(registry, g, "gauge")
}

pub(super) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    register(registry, g, "gauge")
}

pub(super) fn float_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::GaugeVec {
    let g =
        prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    register(registry, g, "gauge")
}

pub(super) fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("static metric definition");
    register(registry, h, "histogram")
}

impl Metrics {
    /// Create and register every metric, including process CPU and memory.
    pub fn new(counter_names: &[String]) -> Metrics {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            note(&pc, "process");
            let _ = registry.register(Box::new(pc));
        }
        // What is running, as Prometheus' own build_info: a constant 1 whose labels say it.
        let build = gauge_vec(
            &registry,
            "tally_build_info",
            "Always 1; the labels say which tally this is (version, git commit).",
            &["version", "commit"],
        );
        build
            .with_label_values(&[
                crate::ops::build_info::VERSION,
                crate::ops::build_info::COMMIT,
            ])
            .set(1);
        let (consumer, decode) = (
            ConsumerMetrics::new(&registry),
            DecodeMetrics::new(&registry),
        );
        let aggregate = AggregateMetrics::new(&registry, counter_names);
        let (sink, redis) = (SinkMetrics::new(&registry), RedisMetrics::new(&registry));
        let recovery = RecoveryMetrics::new(&registry);
        Metrics {
            request: RequestMetrics::new(&registry),
            jobs: JobMetrics::new(&registry, counter_names),
            rls: RlsMetrics::new(&registry),
            publish: PublishMetrics::new(&registry, counter_names),
            consumer,
            decode,
            aggregate,
            sink,
            redis,
            recovery,
            registry,
            status: Default::default(),
        }
    }

    /// Keep a live status with a heavy-hitters summary of `hot_keys` keys (0: none).
    pub fn with_status(mut self, hot_keys: usize) -> Metrics {
        self.status = std::sync::Arc::new(crate::ops::status::Status::new(hot_keys));
        self
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encode error: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::build_info::{COMMIT, VERSION};

    #[test]
    fn metrics_export_the_build() {
        let text = super::Metrics::new(&[]).render();
        let line = format!("tally_build_info{{commit=\"{COMMIT}\",version=\"{VERSION}\"}} 1");
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
}
