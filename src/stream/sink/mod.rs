//! Flush to Redis: one task owns the connection and applies batches it is sent, in order.
//!
//! A batch is retried with exponential backoff and jitter until it lands or the process is
//! aborted. Retrying is always safe: every unit carries its offset range and the script refuses
//! a range that Redis has already applied (see [`script`]), so a retry after a lost reply, a
//! NOSCRIPT reload or a reconnect never counts twice.
//!
//! The sink is one type, [`Sink`], whose `impl` is all in this file; what it uses has its own
//! home: `request.rs` (what it is asked, its errors), `encode.rs` (a flush planned and encoded, as
//! free functions over a plan), `fences.rs` (the one fence reader), `reapply.rs` (the kept
//! flushes, applied again by `reapply::Kept` itself), `link.rs` (the connection and its
//! scripts), `topology.rs` (following a failover), `reply.rs` (the scripts' replies).

pub use tally_counters::conn;
mod encode;
pub use encode::CHUNK_KEYS;
pub use link::warn_if_aof_loads_truncated;
mod fences;
mod link;
pub mod merge;
mod reapply;
mod reply;
mod request;
pub mod script;
mod topology;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redis::RedisError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{FlushConfig, RedisConfig, RedisMode};
pub use crate::model::state_keys::FenceScope;
use crate::ops::health::Health;
use crate::ops::metrics::{Metrics, RedisErrorKind};
use crate::stream::aggregate::FlushUnit;
use encode::Plan;
use link::{Link, Probing, Scripts};
pub use reply::{FlushOutcome, Refusal, ReplyError};
pub use request::{AttemptError, FenceError, PartitionFences, SinkRequest};
pub use script::{ApplyReply, FenceState};

/// How often Redis is checked between requests.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How often while it is unreachable.
const PROBE_WHILE_DOWN: Duration = Duration::from_millis(500);

/// The task owning the Redis connection.
pub struct Sink {
    /// The connection and how it is (re)made.
    link: Link,
    /// The write scripts, loaded on every (re)connection.
    scripts: Scripts,
    /// Flushes prepared so far; every `ttl_check_every`-th checks existing keys' expiry.
    flushes: u64,
    /// What the periodic probe between requests remembers.
    probing: Probing,
    /// Accept a maxmemory-policy other than noeviction (`redis.allow_eviction`).
    allow_eviction: bool,
    /// The names of this consumer group's fences and state markers.
    scope: FenceScope,
    /// Retry delays, chunk sizes, the TTL check cadence.
    flush: FlushConfig,
    /// Flush, retry and error counters.
    metrics: Metrics,
    /// `health.redis`: readiness follows what the sink last saw.
    health: Arc<Health>,
    /// The last landed flushes, applied again where a failover took them back.
    kept: reapply::Kept,
}

pub use conn::client;
use tally_counters::script::{is_noscript, Script};

impl Sink {
    /// A sink for `scope`; connects lazily.
    pub fn new(
        config: &RedisConfig,
        flush: FlushConfig,
        scope: FenceScope,
        metrics: Metrics,
        health: Arc<Health>,
    ) -> Result<Sink, RedisError> {
        Ok(Sink {
            link: Link {
                connector: conn::Connector::new(config)?,
                conn: None,
                topology: match config.mode {
                    RedisMode::Cluster => Some(topology::TopologyWatch::new(
                        conn::seed_clients(config)?,
                        topology::Watched::Cluster,
                    )),
                    RedisMode::Sentinel => Some(topology::TopologyWatch::new(
                        conn::sentinel_clients(config)?,
                        topology::Watched::Sentinel(config.master_name.clone()),
                    )),
                    RedisMode::Standalone => None,
                },
                seeds: None,
                connections: Arc::default(),
            },
            scripts: Scripts {
                apply: Script::new("apply", script::APPLY_LUA),
                apply_kinds: Script::new("apply_kinds", script::APPLY_KINDS_LUA),
                apply_merged: Script::new("apply_merged", script::APPLY_MERGED_LUA),
            },
            flushes: 0,
            probing: Probing::default(),
            allow_eviction: config.allow_eviction,
            scope,
            flush,
            metrics,
            health,
            kept: reapply::Kept::new(0),
        })
    }

    /// Keep the last landed flushes, up to `entries` keys and other entries, to apply them
    /// again after a failover loses them (see [`reapply`]); 0 keeps none.
    pub fn reapplying(mut self, entries: usize) -> Sink {
        self.kept = reapply::Kept::new(entries);
        self
    }

    /// Counts the connections the sink makes (see [`Link`]'s `connections`).
    pub fn connections(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.link.connections.clone()
    }

    /// Check before anything is consumed that Redis will not evict tally's keys. An unreachable
    /// Redis is not an error here (the sink waits for it); an unsafe policy is.
    pub async fn preflight(&mut self) -> Result<(), AttemptError> {
        match self.connection().await {
            Err(e @ AttemptError::UnsafeEviction(_)) => Err(e),
            Ok(mut conn) => {
                link::warn_if_aof_loads_truncated(&mut conn).await;
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }

    /// Serve requests until the channel closes. `abort` stops retrying (requests in progress
    /// are then dropped without a reply, which the sender treats as "not applied").
    pub async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<SinkRequest>,
        abort: CancellationToken,
    ) {
        // Between requests, check Redis every few seconds so readiness and logs tell the truth
        // even while nothing is flushed (e.g. no partitions yet); while it is down, twice a
        // second, so a failover is followed (and the fences re-read) soon after the promotion.
        let mut probe_at = tokio::time::Instant::now();
        loop {
            let request = tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => request,
                    None => break,
                },
                _ = tokio::time::sleep_until(probe_at) => {
                    self.probe().await;
                    let up = self.health.redis.load(Ordering::Relaxed);
                    probe_at = tokio::time::Instant::now() + if up { PROBE_EVERY } else { PROBE_WHILE_DOWN };
                    continue;
                }
            };
            match request {
                SinkRequest::Flush { units, reply } => {
                    if let Some(outcome) = self.flush(units, &abort).await {
                        let _ = reply.send(outcome);
                    }
                }
                SinkRequest::InitFences {
                    partitions,
                    deadline,
                    reply,
                } => {
                    let result = self.init(&partitions, deadline, &abort).await;
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// Apply `units`, retrying until they land; None when aborted first.
    async fn flush(
        &mut self,
        units: Vec<FlushUnit>,
        abort: &CancellationToken,
    ) -> Option<FlushOutcome> {
        let started = Instant::now();
        let keys: usize = units.iter().map(|u| u.items()).sum();
        let check_ttl = self
            .flushes
            .is_multiple_of(u64::from(self.flush.ttl_check_every));
        self.flushes += 1;
        // Planned once; each attempt encodes and sends it a chunk at a time.
        let plan = Plan::new(units, self.flush.max_keys_per_merged_call, check_ttl);
        let mut delay = self.flush.retry_initial;
        let outcome = loop {
            match self.attempt(&plan).await {
                Ok(outcome) => break outcome,
                Err(e) => {
                    if !self.recover(e, &mut delay, abort).await {
                        return None;
                    }
                }
            }
        };
        if let Some(watch) = &mut self.link.topology {
            watch.reset();
        }
        // A refused unit is replayed from Kafka by the worker: what is kept no longer reaches
        // its partitions' last landed range.
        if outcome.refusals.is_empty() {
            self.kept.keep(plan);
        } else {
            self.kept.forget();
        }
        outcome.observe(&self.metrics, started, keys);
        Some(outcome)
    }

    /// Account for a failed attempt and wait before the next; false when aborted.
    async fn recover(
        &mut self,
        error: AttemptError,
        delay: &mut Duration,
        abort: &CancellationToken,
    ) -> bool {
        if abort.is_cancelled() {
            return false;
        }
        if let AttemptError::TopologyChanged = error {
            // Abandoned (safe: a pipeline that still lands is skipped by its fence on the
            // retry); reconnect at once, which reads the new slot map.
            self.link.conn = None;
            self.metrics.redis.redis_retries.inc();
            *delay = self.flush.retry_initial;
            tracing::info!("redis primaries changed (a failover); retrying at once");
            return true;
        }
        if let AttemptError::NoScript = error {
            // Reloaded already; retry at once: units that did apply are skipped by their fence.
            self.metrics.redis.noscript_reloads.inc();
            tracing::info!("flush script was missing in redis and has been loaded again");
            return true;
        }
        self.note_failure(&error);
        self.metrics.redis.redis_retries.inc();
        if let Some(watch) = &mut self.link.topology {
            watch.arm().await;
        }
        let jittered = delay.mul_f64(rand::rng().random_range(0.5..1.0));
        tracing::warn!(error = %error, retry_in = ?jittered, "redis request failed, will retry");
        *delay = (*delay * 2).min(self.flush.retry_max);
        tokio::select! {
            _ = tokio::time::sleep(jittered) => true,
            _ = topology_changed(&mut self.link.topology) => {
                // A failover (or resharding) completed: retry now, and quickly again if the
                // nodes' views still disagree for a moment.
                tracing::info!("redis primaries changed (a failover); retrying at once");
                *delay = self.flush.retry_initial;
                true
            }
            _ = abort.cancelled() => false,
        }
    }

    /// Count a failed request and drop the connection (the next request reconnects, which
    /// also refreshes a cluster's topology).
    fn note_failure(&mut self, error: &AttemptError) {
        let kind = match error {
            AttemptError::Redis(r) if r.is_timeout() => RedisErrorKind::Timeout,
            AttemptError::Redis(r) if r.is_connection_refusal() => RedisErrorKind::Connect,
            AttemptError::Redis(r) if r.is_io_error() || r.is_connection_dropped() => {
                RedisErrorKind::Io
            }
            AttemptError::UnsafeEviction(_) => RedisErrorKind::EvictionPolicy,
            _ => RedisErrorKind::Response,
        };
        self.metrics.redis.redis_error(kind);
        self.health.redis.store(false, Ordering::Relaxed);
        self.link.conn = None;
    }

    /// Refuse to write while Redis may evict keys (unless allowed): an evicted counter or
    /// offset silently breaks exactness.
    async fn check_eviction(&mut self, conn: &mut conn::Conn) -> Result<(), AttemptError> {
        let policies = conn.eviction_policies().await?;
        let unsafe_policy = policies.into_iter().find(|p| p != "noeviction");
        self.metrics
            .redis
            .eviction_policy_unsafe
            .set(i64::from(unsafe_policy.is_some()));
        match unsafe_policy {
            Some(policy) if !self.allow_eviction => Err(AttemptError::UnsafeEviction(policy)),
            Some(policy) => {
                tracing::warn!(%policy, "redis may evict keys (allowed by redis.allow_eviction)");
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn connection(&mut self) -> Result<conn::Conn, AttemptError> {
        if let Some(conn) = &self.link.conn {
            return Ok(conn.clone());
        }
        // While a failover is followed, seed only from nodes that answer the watch.
        let mut conn = match &self.link.seeds {
            Some(seeds) => self.link.connector.connect_via(seeds).await?,
            None => self.link.connector.connect().await?,
        };
        self.check_eviction(&mut conn).await?;
        self.scripts.load(&mut conn).await?;
        // Before anything else is written (and before the worker's fence check, which follows
        // the connection count): what a failover took back goes in again first.
        self.reapply_if_lost(&conn).await?;
        self.health.redis.store(true, Ordering::Relaxed);
        self.link.connections.fetch_add(1, Ordering::Relaxed);
        self.link.conn = Some(conn.clone());
        Ok(conn)
    }

    /// One flush attempt. While a cluster flush is being retried, the attempt is abandoned as
    /// soon as the primaries change: a request caught by a failover can otherwise hang
    /// until its response timeout, long after the replica took over.
    async fn attempt(&mut self, plan: &Plan) -> Result<FlushOutcome, AttemptError> {
        let mut watch = self.link.lend_watch();
        let result = topology::watched(
            watch.as_mut(),
            self.try_flush(plan),
            AttemptError::TopologyChanged,
        )
        .await;
        self.link.topology = watch;
        result
    }

    /// Send every shard's calls (concurrently across shards, chunk after chunk within one) and
    /// read the replies.
    async fn try_flush(&mut self, plan: &Plan) -> Result<FlushOutcome, AttemptError> {
        let conn = self.connection().await?;
        let (scripts, scope) = (&self.scripts, &self.scope);
        let results = futures::future::join_all(plan.groups.iter().map(|calls| {
            let calls = calls.iter().collect();
            encode::send_calls(conn.clone(), calls, plan.check_ttl, scripts, scope)
        }))
        .await;
        let mut outcome = FlushOutcome::default();
        let mut noscript = false;
        let mut first_error = None;
        for result in results {
            let replies = match result {
                Ok(replies) => replies,
                Err(AttemptError::Redis(e)) if is_noscript(&e) => {
                    noscript = true;
                    continue;
                }
                Err(AttemptError::Redis(e)) => {
                    first_error.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (call, reply) in &replies {
                outcome.absorb(call, reply)?;
            }
        }
        // Any failure fails the attempt; the retry re-sends everything and the fences skip
        // what did land.
        if noscript {
            let mut conn = conn;
            self.scripts.load(&mut conn).await?;
            return Err(AttemptError::NoScript);
        }
        if let Some(e) = first_error {
            return Err(AttemptError::Redis(e));
        }
        Ok(outcome)
    }

    /// Connect (or PING the live connection) and report changes of reachability.
    async fn probe(&mut self) {
        let was_up = self.health.redis.load(Ordering::Relaxed);
        self.probing.count += 1;
        // Re-check the eviction policy every other probe: someone may change it at runtime.
        let recheck = self.probing.count.is_multiple_of(2);
        let result = match self.connection().await {
            Ok(mut conn) if recheck => self.check_eviction(&mut conn).await,
            Ok(mut conn) => conn
                .query::<String>(&redis::cmd("PING"))
                .await
                .map(drop)
                .map_err(AttemptError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(_) => {
                if !was_up {
                    tracing::info!("redis reachable");
                }
                self.health.redis.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                self.link.conn = None;
                if was_up || !self.probing.reported_down {
                    tracing::warn!(error = %e, "redis unreachable or unusable; retrying");
                    self.probing.reported_down = true;
                }
                self.health.redis.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Read (and create) the fences of `partitions`, retrying until `deadline`: a rebalance
    /// during a cluster failover otherwise parked its partitions for seconds after the
    /// promotion (one attempt hung on the dead primary until its response timeout).
    async fn init(
        &mut self,
        partitions: &[(i32, i64)],
        deadline: Instant,
        abort: &CancellationToken,
    ) -> Result<PartitionFences, FenceError> {
        let mut delay = self.flush.retry_initial;
        loop {
            let mut watch = self.link.lend_watch();
            let attempt = topology::watched(
                watch.as_mut(),
                self.try_init(partitions),
                AttemptError::TopologyChanged,
            );
            let result = tokio::time::timeout_at(deadline.into(), attempt).await;
            self.link.topology = watch;
            let error = match result {
                Ok(Ok(fences)) => {
                    if let Some(watch) = &mut self.link.topology {
                        watch.reset();
                    }
                    return Ok(fences);
                }
                Ok(Err(e)) => e,
                Err(_) => return Err(FenceError::NoAnswer),
            };
            let message = error.to_string();
            let wait = self.recover(error, &mut delay, abort);
            match tokio::time::timeout_at(deadline.into(), wait).await {
                Ok(true) => {}
                Ok(false) | Err(_) => return Err(FenceError::Failed(message)),
            }
        }
    }

    /// One attempt at the fences of `partitions` (partition, start if Redis has no state), on
    /// every shard.
    async fn try_init(
        &mut self,
        partitions: &[(i32, i64)],
    ) -> Result<PartitionFences, AttemptError> {
        let conn = self.connection().await?;
        // The fence check reads through here: what a failover took back and is still kept
        // goes in again first, so only older losses are replayed from Kafka.
        self.reapply_if_lost(&conn).await?;
        let reads: Vec<fences::ShardRead<'_>> = (0..self.scope.layout.shards())
            .map(|shard| (shard, partitions))
            .collect();
        let per_shard = fences::read(&conn, &self.scope, &reads).await?;
        Ok(partitions
            .iter()
            .enumerate()
            .map(|(i, &(p, _))| (p, per_shard.iter().map(|states| states[i]).collect()))
            .collect())
    }

    /// [`reapply::Kept::reapply_if_lost`] on `conn`.
    async fn reapply_if_lost(&mut self, conn: &conn::Conn) -> Result<(), AttemptError> {
        let target = reapply::ReapplyTarget {
            scripts: &self.scripts,
            scope: &self.scope,
        };
        self.kept.reapply_if_lost(conn, target, &self.metrics).await
    }
}

/// Completes when `watch` sees the cluster's primaries change; never without a watch.
async fn topology_changed(watch: &mut Option<topology::TopologyWatch>) {
    match watch {
        Some(watch) => watch.changed().await,
        None => std::future::pending().await,
    }
}
