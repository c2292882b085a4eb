//! The one reader of fences ([`script::INIT_LUA`], one script per shard): the fence check of
//! partitions being opened reads (and creates) them with it, and the kept flushes (`reapply.rs`)
//! read with it, creating nothing, where Redis is behind what landed.

use redis::Value;

use super::reply::ReplyError;
use super::script::{self, FenceState};
use super::{conn, AttemptError, FenceScope};

/// The partitions whose fences are read on one shard: (partition, where to start it if Redis
/// has no state for it; -1: do not create).
pub(super) type ShardRead<'a> = (u32, &'a [(i32, i64)]);

/// The fence state of every partition of every `reads` entry, in the same order. One script per
/// shard, sent concurrently: in a cluster a shard's marker and fences share a slot.
pub(super) async fn read(
    conn: &conn::Conn,
    scope: &FenceScope,
    reads: &[ShardRead<'_>],
) -> Result<Vec<Vec<FenceState>>, AttemptError> {
    let now_ms = tally_counters::clock::unix_ms();
    let cmds: Vec<redis::Cmd> = reads
        .iter()
        .map(|&(shard, partitions)| init_cmd(scope, shard, partitions, now_ms))
        .collect();
    let results = futures::future::join_all(cmds.iter().map(|cmd| {
        let mut conn = conn.clone();
        async move { conn.query::<Value>(cmd).await }
    }))
    .await;
    let mut per_shard = Vec::with_capacity(reads.len());
    for (result, &(_, partitions)) in results.into_iter().zip(reads) {
        let items = match result? {
            Value::Array(items) if items.len() == partitions.len() => items,
            other => return Err(AttemptError::Reply(ReplyError::unknown("init", &other))),
        };
        per_shard.push(
            items
                .iter()
                .map(FenceState::parse)
                .collect::<Result<_, _>>()
                .map_err(AttemptError::Reply)?,
        );
    }
    Ok(per_shard)
}

/// The [`script::INIT_LUA`] call reading `partitions` on `shard` (EVAL: rare and small, so
/// there is no NOSCRIPT to handle).
fn init_cmd(scope: &FenceScope, shard: u32, partitions: &[(i32, i64)], now_ms: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script::INIT_LUA)
        .arg(partitions.len() + 1)
        .arg(scope.marker(shard));
    for &(p, _) in partitions {
        cmd.arg(scope.key(p, shard));
    }
    cmd.arg(now_ms);
    for &(p, fresh) in partitions {
        cmd.arg(p).arg(fresh);
    }
    cmd
}
