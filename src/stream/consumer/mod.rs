//! Consume: one thread owns the Kafka consumer, decodes and aggregates, and hands sealed
//! batches to the Redis sink. A process runs one such lane per `kafka.consumers`
//! (`pipeline::lane`); lanes share nothing a partition's exactness depends on. Rebalance callbacks run on this same thread (inside `poll`), so a
//! revoked partition is flushed and committed before it is released, without races.
//!
//! Offsets: on assignment a partition starts at the offset Redis says it has applied (the
//! minimum over its shards), not at Kafka's committed offset; Kafka commits follow each landed
//! flush so that lag monitoring works. Redis is the source of truth.
//!
//! The files, one owner each: `worker.rs` (the [`Worker`], which routes each event between the
//! others), `flush.rs` (the sink channel, the flush in flight, backpressure), `commit.rs`
//! (Kafka commits), `partitions.rs` (parked, rebuilding and revoking partitions, and reading
//! Kafka's offsets), `recovery.rs` (the pure decision where a partition starts, with its
//! table), `decode_tally.rs` (input counts and bad messages), `rebalance.rs` (the rebalance
//! callback), `policy.rs` (when to flush and pause) and `dead_letter.rs`.

mod commit;
mod dead_letter;
mod decode_tally;
pub mod discover;
mod flush;
mod lag;
mod partitions;
pub mod policy;
mod rebalance;
mod recovery;
mod worker;

use std::cell::RefCell;
use std::sync::Arc;

use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;
use tokio_util::sync::CancellationToken;

use crate::ops::health::Health;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::{Metrics, ResetReason};

pub use dead_letter::DeadLetters;
pub use lag::LagProbe;
pub use partitions::StateAccess;
pub use policy::FlushPolicy;
pub use worker::Worker;

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The rdkafka context: routes rebalances and statistics to the worker.
pub struct TallyContext {
    /// Only the consumer thread touches the worker: the loop holds this lock across a batch of
    /// polls, and rebalance callbacks (run inside `poll`, on the same thread) re-enter it.
    worker: ReentrantMutex<RefCell<Worker>>,
    metrics: Metrics,
    health: Arc<Health>,
    topic: String,
    shutdown: CancellationToken,
    /// Rate limit for Kafka client errors and librdkafka warnings.
    kafka_log: LogLimiter,
    /// Rate limit for refused credentials, apart: librdkafka's own warnings must not hide them.
    auth_log: LogLimiter,
}

impl TallyContext {
    /// Context for a consumer of `topic`.
    pub fn new(worker: Worker, health: Arc<Health>, shutdown: CancellationToken) -> TallyContext {
        TallyContext {
            metrics: worker.metrics().clone(),
            topic: worker.topic().to_string(),
            worker: ReentrantMutex::new(RefCell::new(worker)),
            health,
            shutdown,
            kafka_log: LogLimiter::new(),
            auth_log: LogLimiter::new(),
        }
    }

    fn lock(&self) -> ReentrantMutexGuard<'_, RefCell<Worker>> {
        self.worker.lock()
    }
}

impl ClientContext for TallyContext {
    fn stats(&self, statistics: Statistics) {
        // Readiness only: the ends and the lag come from the lag probe ([`lag`]), which asks the
        // broker for paused and halted partitions too.
        self.health.kafka.observe(&statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::Authentication) {
            // Retried by librdkafka forever: readiness says why until the group is joined.
            self.health.kafka.authentication_failed(reason);
            if let Some(suppressed) = self.auth_log.allow() {
                tracing::error!(
                    reason,
                    suppressed,
                    "kafka authentication failed: check the sasl.* entries of [kafka.properties]"
                );
            }
            return;
        }
        if let Some(suppressed) = self.kafka_log.allow() {
            tracing::warn!(error = %error, reason, suppressed, "kafka client error");
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let serious = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        // A commit refused because the group is rebalancing is expected (Redis, not Kafka's
        // offset, says where a partition resumes): librdkafka reports it as a warning.
        let rebalancing = fac == "COMMITFAIL"
            && [
                "rebalance in progress",
                "generation id is not valid",
                "member id",
            ]
            .iter()
            .any(|m| message.contains(m));
        if !serious || rebalancing {
            tracing::debug!(fac, message, "librdkafka");
        } else if let Some(suppressed) = self.kafka_log.allow() {
            tracing::warn!(fac, message, suppressed, "librdkafka");
        }
    }
}

/// The consumer thread: poll, decode, aggregate, flush; until `shutdown`, then a final flush.
/// `ready` returns when the consumer may join the group (the lanes of a process join together);
/// `before_close` runs after the final flush and commit, before the consumer leaves the group:
/// lanes of one process wait there for each other, so that one lane leaving (a rebalance) does
/// not make another lane's final commit fail.
pub fn run(
    consumer: BaseConsumer<TallyContext>,
    grace: Duration,
    ready: impl FnOnce(),
    before_close: impl FnOnce(),
) -> Result<(), KafkaError> {
    let ctx = consumer.context().clone();
    ready();
    consumer.subscribe(&[&ctx.topic])?;
    let mut now_ms = unix_ms();
    let mut polls: u32 = 0;
    // Messages arrived since readiness last heard of it (told every 64 polls, not per message).
    let mut fetched = false;
    // Held across polls: rebalance callbacks re-enter it on this thread. The worker is borrowed
    // only for one call at a time, never across a poll.
    let mut guard = ctx.lock();
    while !ctx.shutdown.is_cancelled() {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            now_ms = unix_ms();
            if std::mem::take(&mut fetched) {
                ctx.health.kafka.seen();
            }
            guard.borrow_mut().tick(&consumer);
            ReentrantMutexGuard::bump(&mut guard);
        }
        // A non-blocking poll first: with messages queued (the busy case) librdkafka then skips
        // its timeout bookkeeping (clock reads); block only when the queue is empty.
        let polled = match consumer.poll(Duration::ZERO) {
            None => consumer.poll(Duration::from_millis(20)),
            some => some,
        };
        match polled {
            None => {
                now_ms = unix_ms();
                if std::mem::take(&mut fetched) {
                    ctx.health.kafka.seen();
                }
                let mut worker = guard.borrow_mut();
                worker.caught_up();
                worker.tick(&consumer);
            }
            Some(Err(e)) => {
                if is_offset_reset(&e) {
                    // librdkafka moved a partition to the start of the log because the
                    // position it was reading had been deleted: what lay between is lost.
                    ctx.metrics.recovery.offset_reset(ResetReason::AutoReset);
                    tracing::error!(error = %e, "kafka reset a partition's position: offsets deleted by retention before tally read them are lost");
                } else if let Some(suppressed) = ctx.kafka_log.allow() {
                    tracing::warn!(error = %e, suppressed, "kafka consume error");
                }
                guard.borrow_mut().tick(&consumer);
            }
            Some(Ok(msg)) => {
                fetched = true;
                guard.borrow_mut().handle(&msg, now_ms);
            }
        }
    }
    tracing::info!("shutting down: final flush");
    guard.borrow_mut().finish(&consumer, grace);
    drop(guard);
    before_close();
    tracing::debug!("closing the kafka consumer");
    drop(consumer);
    tracing::debug!("kafka consumer closed");
    Ok(())
}

fn is_offset_reset(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::AutoOffsetReset | C::OffsetOutOfRange)
    )
}

use tally_counters::clock::unix_ms;
