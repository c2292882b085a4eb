//! Reading and creating fences for partitions being opened ([`script::INIT_LUA`]), one script
//! per shard.

use redis::Value;

use super::script::{self, FenceState};
use super::{AttemptError, PartitionFences, Sink};

impl Sink {
    /// One attempt at the fences of `partitions` (partition, start if Redis has no state).
    pub(super) async fn try_init(
        &mut self,
        partitions: &[(i32, i64)],
    ) -> Result<PartitionFences, AttemptError> {
        let conn = self.connection().await?;
        let shards = self.scope.layout.shards();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
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
                other => return Err(AttemptError::Reply(format!("fence states: {other:?}"))),
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
