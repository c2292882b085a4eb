//! The sink's connection side: the connection and how it is remade (through the seeds that
//! answer during a cluster failover), the write scripts loaded on every connection, and what the
//! probe between requests remembers.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tally_counters::script::Script;

use super::{conn, topology, AttemptError};

/// The connection to Redis (standalone, or every primary of a cluster).
pub(super) struct Link {
    /// Makes connections (from `redis.url`, or the cluster's seeds).
    pub(super) connector: conn::Connector,
    /// The live connection; None until the first use and after a failure (reconnect next).
    pub(super) conn: Option<conn::Conn>,
    /// In a cluster: ends a retry's wait when the primaries change (a failover).
    pub(super) topology: Option<topology::TopologyWatch>,
    /// The seeds to connect through while following a failover: those that answered the
    /// watch (`None`: all). Taken when an attempt starts, as the watch is lent to it.
    pub(super) seeds: Option<Vec<usize>>,
    /// Connections made so far: the worker re-reads its fences after each new one (Redis came
    /// back, or the primary changed), as a failover can take them back.
    pub(super) connections: Arc<AtomicU64>,
}

/// The write scripts (SCRIPT LOAD on connect, EVALSHA per call).
pub(super) struct Scripts {
    /// Counts only (`INCRBY` + expiry per key).
    pub(super) apply: Script,
    /// Counts and the other kinds (hash fields, distinct members, leaderboard scores).
    pub(super) apply_kinds: Script,
    /// Several units of one shard in one call.
    pub(super) apply_merged: Script,
}

/// The probe between requests.
#[derive(Default)]
pub(super) struct Probing {
    /// Probes so far (the eviction policy is re-checked every other one).
    pub(super) count: u32,
    /// An unreachable Redis was logged (the probe logs transitions only).
    pub(super) reported_down: bool,
}

impl Link {
    /// Take the topology watch to run an attempt under it (put it back after), noting first
    /// which seeds answered it: the attempt connects through those.
    pub(super) fn lend_watch(&mut self) -> Option<topology::TopologyWatch> {
        self.seeds = self.topology.as_ref().and_then(|w| w.answering());
        self.topology.take()
    }
}

impl Scripts {
    /// SCRIPT LOAD (on every primary of a cluster).
    pub(super) async fn load(&self, conn: &mut conn::Conn) -> Result<(), AttemptError> {
        self.apply.load(conn).await?;
        self.apply_kinds.load(conn).await?;
        Ok(self.apply_merged.load(conn).await?)
    }
}

/// Warn when Redis keeps the AOF on and loads a truncated one (`aof-load-truncated yes`, its
/// default). A crash in the middle of writing a flush's transaction to the AOF leaves part of it
/// there; Redis 7.0 cuts the file inside the transaction on the next start (the part is not
/// applied, and tally's retry applies the flush whole), then appends after it, and at the start
/// after that applies the part along with the next transaction: those keys are counted twice,
/// with no fence to tell (measured with redis-server 7.0.15; valkey-io/valkey#4342 fixes it).
/// With `aof-load-truncated no` Redis refuses such a file until `redis-check-aof --fix` cuts it
/// before the transaction. Read with `CONFIG GET` (one node of a cluster); where CONFIG is not
/// allowed, nothing is said.
pub async fn warn_if_aof_loads_truncated(conn: &mut conn::Conn) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("appendonly").arg("aof-load-truncated");
    let Ok(pairs) = conn
        .query::<std::collections::HashMap<String, String>>(&cmd)
        .await
    else {
        return;
    };
    let on = |k: &str| pairs.get(k).is_some_and(|v| v == "yes");
    if on("appendonly") && on("aof-load-truncated") {
        tracing::warn!(
            "redis loads a truncated AOF (appendonly yes, aof-load-truncated yes): after a redis crash in the middle of writing a flush, redis 7.x can apply part of that flush at a later restart on top of tally's retry (counted twice; valkey-io/valkey#4342); set aof-load-truncated no and run redis-check-aof --fix when redis refuses to start"
        );
    }
}
