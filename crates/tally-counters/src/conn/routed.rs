//! Knowing which server connection a cluster command ran on, and sending a `WAIT` to one
//! primary. `WAIT replicas timeout` covers only the writes made on its own connection, and a
//! cluster client holds one connection per node, replaced when it breaks or the topology
//! changes: a `WAIT` confirms a write only if it ran on the very connection the write did.
//! redis-rs does not say which one a command used, so the server is asked: `CLIENT INFO` sent in
//! the same pipeline as the command (a pipeline goes over one node connection) names the
//! connection by its client id and both ends of its socket.
//!
//! A `WAIT` sent through the cluster client as a plain command goes to every primary and
//! answers the fewest replicas any of them has (redis-rs routes it to all primaries and takes
//! the minimum): one shard without a replica would make every write on every shard look
//! unreplicated. [`Conn::wait_on_slot`] sends it to the primary of one slot only.

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisError, RedisResult, Value};

use super::Conn;

/// One server connection, as the server names it in `CLIENT INFO`: its client id (never reused
/// while the server runs) and both ends of its socket (`addr`, `laddr`), so that two servers, or
/// one server restarted, that hand out the same id are still told apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerConn {
    /// `id=`: the server's number for the connection.
    id: u64,
    /// `addr=`: the client's end of the socket (address and local port).
    addr: String,
    /// `laddr=`: the server's end of the socket.
    laddr: String,
}

impl ServerConn {
    /// Read from a `CLIENT INFO` line (`id=7 addr=127.0.0.1:50312 laddr=127.0.0.1:7000 ...`);
    /// None when a field is missing (Redis before 6.2 has no `laddr`).
    pub fn parse(info: &str) -> Option<ServerConn> {
        let field = |name: &str| {
            info.split_ascii_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        Some(ServerConn {
            id: field("id")?.parse().ok()?,
            addr: field("addr")?.to_string(),
            laddr: field("laddr")?.to_string(),
        })
    }

    fn from_reply(value: Value) -> Option<ServerConn> {
        redis::from_redis_value::<String>(value)
            .ok()
            .as_deref()
            .and_then(ServerConn::parse)
    }
}

impl Conn {
    /// Run `cmd` (a single-slot command) and, over the same node connection, `CLIENT INFO`: its
    /// reply (an error reply as the error), and the connection it ran on. The connection is
    /// None when the server did not say (`CLIENT INFO` refused by an ACL, or this is not a
    /// cluster connection: a single server's connection is told apart by the caller).
    pub async fn query_traced(&mut self, cmd: &Cmd) -> RedisResult<(Value, Option<ServerConn>)> {
        let Conn::Cluster(c) = self else {
            return Ok((self.query(cmd).await?, None));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("CLIENT")
            .arg("INFO")
            .ignore_errors();
        // Routed as a whole by the command's key (CLIENT INFO has none).
        let replies: Vec<Value> = c
            .clone()
            .unless_stuck(pipe.query_async(&mut c.client))
            .await?;
        let mut replies = replies.into_iter();
        let reply = replies.next().unwrap_or(Value::Nil).extract_error()?;
        Ok((reply, replies.next().and_then(ServerConn::from_reply)))
    }

    /// `CLIENT INFO` then `WAIT replicas ms` on the connection to the primary of `slot` (a
    /// single server: on its connection): the replicas that acknowledged, and the connection
    /// the `WAIT` ran on (None when the server did not say).
    pub async fn wait_on_slot(
        &mut self,
        slot: u16,
        replicas: u32,
        ms: u64,
    ) -> RedisResult<(i64, Option<ServerConn>)> {
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT")
            .arg("INFO")
            .cmd("WAIT")
            .arg(replicas)
            .arg(ms)
            .ignore_errors();
        let replies: Vec<Value> = match self {
            Conn::Single(_) => self.pipe(&pipe).await?,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let guard = c.clone();
                guard.blocks_for(std::time::Duration::from_millis(ms));
                guard
                    .unless_stuck(c.client.route_pipeline(pipe, 0, 2, route))
                    .await?
            }
        };
        let mut replies = replies.into_iter();
        let conn = replies.next().and_then(ServerConn::from_reply);
        let acked = replies.next().unwrap_or(Value::Nil).extract_error()?;
        let acked = redis::from_redis_value::<i64>(acked).map_err(RedisError::from)?;
        Ok((acked, conn))
    }
}

#[cfg(test)]
mod tests {
    use super::ServerConn;

    #[test]
    fn a_connection_is_its_id_and_both_ends() {
        let a = ServerConn::parse(
            "id=7 addr=127.0.0.1:50312 laddr=127.0.0.1:7000 fd=9 name= age=3 db=0\n",
        )
        .unwrap();
        assert_eq!(a.id, 7);
        assert_eq!(a.addr, "127.0.0.1:50312");
        assert_eq!(a.laddr, "127.0.0.1:7000");
        // The same id on another server is another connection.
        let b = ServerConn::parse("id=7 addr=127.0.0.1:50313 laddr=127.0.0.1:7001").unwrap();
        assert_ne!(a, b);
        // Before Redis 6.2 (no laddr): unknown, never equal to anything.
        assert_eq!(ServerConn::parse("id=7 addr=127.0.0.1:50312 fd=9"), None);
        assert_eq!(ServerConn::parse("laddr=x addr=y"), None);
    }
}
