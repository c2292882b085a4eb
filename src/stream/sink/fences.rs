//! Reading and creating fences for partitions being opened ([`script::INIT_LUA`]), one script
//! per shard.

use std::time::Instant;

use redis::Value;
use tokio_util::sync::CancellationToken;

use super::reply::ReplyError;
use super::script::{self, FenceState};
use super::{topology, AttemptError, FenceError, PartitionFences, Sink};

impl Sink {
    /// Read (and create) the fences of `partitions`, retrying until `deadline`: a rebalance
    /// during a cluster failover otherwise parked its partitions for seconds after the
    /// promotion (one attempt hung on the dead primary until its response timeout).
    pub(super) async fn init(
        &mut self,
        partitions: &[(i32, i64)],
        deadline: Instant,
        abort: &CancellationToken,
    ) -> Result<PartitionFences, FenceError> {
        let mut delay = self.flush.retry_initial;
        loop {
            let mut watch = self.link.lend_watch();
            // INIT runs with EVAL (rare, small): there is no NOSCRIPT to handle.
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

    /// One attempt at the fences of `partitions` (partition, start if Redis has no state).
    pub(super) async fn try_init(
        &mut self,
        partitions: &[(i32, i64)],
    ) -> Result<PartitionFences, AttemptError> {
        let conn = self.connection().await?;
        // The fence check reads through here: what a failover took back and is still kept
        // goes in again first, so only older losses are replayed from Kafka.
        self.reapply_if_lost(&conn).await?;
        let shards = self.scope.layout.shards();
        let now_ms = tally_counters::clock::unix_ms();
        // One script per shard: in a cluster a shard's marker and fences share a slot.
        let cmds: Vec<redis::Cmd> = (0..shards)
            .map(|s| {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script::INIT_LUA)
                    .arg(partitions.len() + 1)
                    .arg(self.scope.marker(s));
                for &(p, _) in partitions {
                    cmd.arg(self.scope.key(p, s));
                }
                cmd.arg(now_ms);
                for &(p, fresh) in partitions {
                    cmd.arg(p).arg(fresh);
                }
                cmd
            })
            .collect();
        let results = futures::future::join_all(cmds.iter().map(|cmd| {
            let mut conn = conn.clone();
            async move { conn.query::<Value>(cmd).await }
        }))
        .await;
        let mut per_shard: Vec<Vec<FenceState>> = Vec::with_capacity(shards as usize);
        for r in results {
            let items = match r? {
                Value::Array(items) if items.len() == partitions.len() => items,
                other => {
                    return Err(AttemptError::Reply(ReplyError(format!(
                        "fence states: {other:?}"
                    ))))
                }
            };
            per_shard.push(
                items
                    .iter()
                    .map(FenceState::parse)
                    .collect::<Result<_, _>>()
                    .map_err(AttemptError::Reply)?,
            );
        }
        Ok(partitions
            .iter()
            .enumerate()
            .map(|(i, &(p, _))| (p, per_shard.iter().map(|states| states[i]).collect()))
            .collect())
    }
}
