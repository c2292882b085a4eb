//! Flush to Redis: one task owns the connection and applies batches it is sent, in order.
//!
//! A batch is retried with exponential backoff and jitter until it lands or the process is
//! aborted. Retrying is always safe: every unit carries its offset range and the script refuses
//! a range that Redis has already applied (see [`script`]), so a retry after a lost reply, a
//! NOSCRIPT reload or a reconnect never counts twice.

pub mod conn;
pub mod layout;
pub mod script;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{RedisError, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::aggregate::Unit;
use crate::config::{FlushConfig, RedisConfig};
use crate::metrics::Metrics;

/// Whether the process' connections are usable, for `/health/ready`.
#[derive(Debug, Default)]
pub struct Health {
    /// Consumer created and group joined (or metadata fetched).
    pub kafka: AtomicBool,
    /// Last Redis request succeeded.
    pub redis: AtomicBool,
}

impl Health {
    /// Ready = both Kafka and Redis reachable.
    pub fn ready(&self) -> bool {
        self.kafka.load(Ordering::Relaxed) && self.redis.load(Ordering::Relaxed)
    }
}

/// Where the applied offsets of one consumer live: prefix, group and topic.
#[derive(Debug, Clone)]
pub struct FenceScope {
    /// `redis.state_prefix`.
    pub prefix: String,
    /// Consumer group id.
    pub group: String,
    /// Topic name.
    pub topic: String,
    /// Key layout: shards per partition and their hash tags.
    pub layout: layout::Layout,
}

impl FenceScope {
    /// The applied-offset key of (partition, shard), tagged like the shard's counter keys.
    pub fn key(&self, partition: i32, shard: u32) -> String {
        script::fence_key(
            &self.prefix,
            &self.group,
            &self.topic,
            partition,
            shard,
            self.layout.tag(shard),
        )
    }
}

/// Work for the sink task. Replies go over std channels so the consumer thread can wait
/// with a timeout without a runtime.
pub enum SinkRequest {
    /// Apply these units, in order.
    Flush {
        /// Units to apply.
        units: Vec<Unit>,
        /// Receives the outcome; dropped without a reply if the sink was aborted.
        reply: std_mpsc::Sender<FlushOutcome>,
    },
    /// Make sure every shard of these partitions has an applied offset (setting `initial` where
    /// none exists) and return them, shard by shard.
    InitFences {
        /// (partition, offset to record where Redis has none).
        partitions: Vec<(i32, i64)>,
        /// Receives `(partition, applied offset per shard)`.
        reply: std_mpsc::Sender<Vec<(i32, Vec<i64>)>>,
    },
}

/// What happened to a flushed batch.
#[derive(Debug, Default)]
pub struct FlushOutcome {
    /// Units refused because Redis applied a different range: (partition, shard, applied).
    pub conflicts: Vec<(i32, u32, i64)>,
    /// Units whose whole range Redis had already applied (nothing written).
    pub already_applied: u64,
    /// Keys written.
    pub keys_written: u64,
    /// Keys skipped by the script because their expiry passed before it ran.
    pub late_keys: u64,
    /// Keys whose Redis value was not an integer.
    pub rejected_keys: u64,
}

/// What reading a unit's reply needs once its keys are encoded.
struct UnitMeta {
    partition: i32,
    shard: u32,
    keys: u64,
}

/// Why one attempt failed; every variant is retried.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("script not loaded (NOSCRIPT)")]
    NoScript,
    #[error("unexpected reply: {0}")]
    Reply(String),
}

/// The task owning the Redis connection.
pub struct Sink {
    connector: conn::Connector,
    conn: Option<conn::Conn>,
    apply_sha: String,
    /// Flushes prepared so far; every `ttl_check_every`-th checks existing keys' expiry.
    flushes: u64,
    /// An unreachable Redis was logged (the probe logs transitions only).
    reported_down: bool,
    scope: FenceScope,
    flush: FlushConfig,
    metrics: Metrics,
    health: Arc<Health>,
}

pub use conn::client;

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
            connector: conn::Connector::new(config)?,
            conn: None,
            apply_sha: redis::Script::new(script::APPLY_LUA).get_hash().to_string(),
            flushes: 0,
            reported_down: false,
            scope,
            flush,
            metrics,
            health,
        })
    }

    /// Serve requests until the channel closes. `abort` stops retrying (requests in progress
    /// are then dropped without a reply, which the sender treats as "not applied").
    pub async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<SinkRequest>,
        abort: CancellationToken,
    ) {
        // Between requests, check Redis every few seconds so readiness and logs tell the truth
        // even while nothing is flushed (e.g. no partitions yet).
        let mut probe = tokio::time::interval(Duration::from_secs(5));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let request = tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => request,
                    None => break,
                },
                _ = probe.tick() => {
                    self.probe().await;
                    continue;
                }
            };
            match request {
                SinkRequest::Flush { units, reply } => {
                    let started = Instant::now();
                    let keys: usize = units.iter().map(|u| u.keys.len()).sum();
                    // Encode once and drop the units: retries resend the same commands.
                    let groups = self.prepare(units);
                    let mut delay = self.flush.retry_initial;
                    let outcome = loop {
                        match self.try_flush(&groups).await {
                            Ok(outcome) => break Some(outcome),
                            Err(e) => {
                                if !self.recover(e, &mut delay, &abort).await {
                                    break None;
                                }
                            }
                        }
                    };
                    let Some(outcome) = outcome else { continue };
                    self.metrics
                        .flush_duration
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics.flush_keys.observe(keys as f64);
                    self.metrics.keys_flushed.inc_by(outcome.keys_written);
                    self.metrics.late_keys.inc_by(outcome.late_keys);
                    self.metrics
                        .fence_conflicts
                        .inc_by(outcome.conflicts.len() as u64);
                    self.metrics
                        .units_already_applied
                        .inc_by(outcome.already_applied);
                    let _ = reply.send(outcome);
                }
                SinkRequest::InitFences { partitions, reply } => {
                    let mut delay = self.flush.retry_initial;
                    loop {
                        match self.try_init(&partitions).await {
                            Ok(fences) => {
                                let _ = reply.send(fences);
                                break;
                            }
                            Err(e) => {
                                if !self.recover(e, &mut delay, &abort).await {
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Connect (or PING the live connection) and report changes of reachability.
    async fn probe(&mut self) {
        let was_up = self.health.redis.load(Ordering::Relaxed);
        let result = match self.connection().await {
            Ok(mut conn) => conn
                .query::<String>(&redis::cmd("PING"))
                .await
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
                self.conn = None;
                if was_up || !self.reported_down {
                    tracing::warn!(error = %e, "redis unreachable; retrying");
                    self.reported_down = true;
                }
                self.health.redis.store(false, Ordering::Relaxed);
            }
        }
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
        if let AttemptError::NoScript = error {
            // Reloaded already; retry at once: units that did apply are skipped by their fence.
            self.metrics.noscript_reloads.inc();
            tracing::info!("flush script was missing in redis and has been loaded again");
            return true;
        }
        let kind = match &error {
            AttemptError::Redis(r) if r.is_timeout() => "timeout",
            AttemptError::Redis(r) if r.is_connection_refusal() => "connect",
            AttemptError::Redis(r) if r.is_io_error() || r.is_connection_dropped() => "io",
            _ => "response",
        };
        self.metrics.redis_errors.with_label_values(&[kind]).inc();
        self.metrics.redis_retries.inc();
        self.health.redis.store(false, Ordering::Relaxed);
        self.conn = None;
        let jittered = delay.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        tracing::warn!(error = %error, retry_in = ?jittered, "redis request failed, will retry");
        *delay = (*delay * 2).min(self.flush.retry_max);
        tokio::select! {
            _ = tokio::time::sleep(jittered) => true,
            _ = abort.cancelled() => false,
        }
    }

    async fn connection(&mut self) -> Result<conn::Conn, AttemptError> {
        if let Some(conn) = &self.conn {
            return Ok(conn.clone());
        }
        let mut conn = self.connector.connect().await?;
        self.load_script(&mut conn).await?;
        self.health.redis.store(true, Ordering::Relaxed);
        self.conn = Some(conn.clone());
        Ok(conn)
    }

    /// SCRIPT LOAD (on every primary of a cluster).
    async fn load_script(&self, conn: &mut conn::Conn) -> Result<(), AttemptError> {
        let sha: String = conn
            .query(redis::cmd("SCRIPT").arg("LOAD").arg(script::APPLY_LUA))
            .await?;
        debug_assert_eq!(sha, self.apply_sha);
        Ok(())
    }

    /// Encode `units` as one pipeline per shard (one slot on a cluster), with what is needed to
    /// read the replies. Units of one (partition, shard) stay in order inside their pipeline.
    fn prepare(&mut self, units: Vec<Unit>) -> Vec<(redis::Pipeline, Vec<UnitMeta>)> {
        let check_ttl = self
            .flushes
            .is_multiple_of(u64::from(self.flush.ttl_check_every));
        self.flushes += 1;
        let mut groups: Vec<(redis::Pipeline, Vec<UnitMeta>)> = Vec::new();
        let mut group_of_shard: std::collections::HashMap<u32, usize> =
            std::collections::HashMap::new();
        for unit in units {
            let g = *group_of_shard.entry(unit.shard).or_insert_with(|| {
                groups.push((redis::pipe(), Vec::new()));
                groups.len() - 1
            });
            let fence = self.scope.key(unit.partition, unit.shard);
            groups[g].0.add_command(script::apply_cmd_with(
                &self.apply_sha,
                &fence,
                &unit,
                check_ttl,
            ));
            groups[g].1.push(UnitMeta {
                partition: unit.partition,
                shard: unit.shard,
                keys: unit.keys.len() as u64,
            });
        }
        groups
    }

    /// Send every shard's pipeline concurrently and read the replies.
    async fn try_flush(
        &mut self,
        groups: &[(redis::Pipeline, Vec<UnitMeta>)],
    ) -> Result<FlushOutcome, AttemptError> {
        let conn = self.connection().await?;
        let results = futures::future::join_all(groups.iter().map(|(pipe, _)| {
            let mut conn = conn.clone();
            async move { conn.pipe(pipe).await }
        }))
        .await;
        let mut outcome = FlushOutcome::default();
        let mut noscript = false;
        let mut first_error = None;
        for ((_, metas), result) in groups.iter().zip(results) {
            let replies = match result {
                Ok(replies) => replies,
                Err(e) if e.code() == Some("NOSCRIPT") => {
                    noscript = true;
                    continue;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            if replies.len() != metas.len() {
                return Err(AttemptError::Reply(format!(
                    "{} replies for {} units",
                    replies.len(),
                    metas.len()
                )));
            }
            for (unit, reply) in metas.iter().zip(replies) {
                let (status, a, b) = match reply {
                    Value::Array(items) if items.len() == 3 => {
                        match (&items[0], &items[1], &items[2]) {
                            (Value::Int(s), Value::Int(a), Value::Int(b)) => (*s, *a, *b),
                            _ => return Err(AttemptError::Reply(format!("{items:?}"))),
                        }
                    }
                    other => return Err(AttemptError::Reply(format!("{other:?}"))),
                };
                match status {
                    1 => {
                        outcome.late_keys += a as u64;
                        outcome.rejected_keys += b as u64;
                        outcome.keys_written += unit.keys - (a + b) as u64;
                    }
                    0 => outcome.already_applied += 1,
                    _ => outcome.conflicts.push((unit.partition, unit.shard, a)),
                }
            }
        }
        // Any failure fails the attempt; the retry re-sends everything and the fences skip
        // what did land.
        if noscript {
            let mut conn = conn;
            self.load_script(&mut conn).await?;
            return Err(AttemptError::NoScript);
        }
        if let Some(e) = first_error {
            return Err(AttemptError::Redis(e));
        }
        if outcome.rejected_keys > 0 {
            tracing::warn!(
                keys = outcome.rejected_keys,
                "counter keys hold non-integer values; left untouched"
            );
        }
        Ok(outcome)
    }

    async fn try_init(
        &mut self,
        partitions: &[(i32, i64)],
    ) -> Result<Vec<(i32, Vec<i64>)>, AttemptError> {
        let conn = self.connection().await?;
        let shards = self.scope.layout.shards();
        // One pipeline per shard: in a cluster each shard's keys share a slot.
        let pipes: Vec<redis::Pipeline> = (0..shards)
            .map(|s| {
                let mut pipe = redis::pipe();
                for &(p, initial) in partitions {
                    pipe.cmd("EVAL")
                        .arg(script::INIT_LUA)
                        .arg(1)
                        .arg(self.scope.key(p, s))
                        .arg(initial);
                }
                pipe
            })
            .collect();
        let results = futures::future::join_all(pipes.iter().map(|pipe| {
            let mut conn = conn.clone();
            async move { conn.pipe(pipe).await }
        }))
        .await;
        let mut per_shard: Vec<Vec<Value>> = Vec::with_capacity(shards as usize);
        for r in results {
            per_shard.push(r?);
        }
        let mut out = Vec::with_capacity(partitions.len());
        for (i, &(p, _)) in partitions.iter().enumerate() {
            let mut applied = Vec::with_capacity(shards as usize);
            for values in &per_shard {
                match values.get(i) {
                    Some(Value::Int(n)) => applied.push(*n),
                    other => return Err(AttemptError::Reply(format!("applied offset: {other:?}"))),
                }
            }
            out.push((p, applied));
        }
        Ok(out)
    }
}
