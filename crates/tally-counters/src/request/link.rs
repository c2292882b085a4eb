//! The connection under a [`super::Client`], shared by the client's clones and its batch
//! driver: opened on first use, dropped when it breaks so that the next call reconnects.

use std::sync::Mutex;

use redis::{Cmd, FromRedisValue, Value};

use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::{Conn, Connector, ServerConn};
use crate::script::Script;

/// Which connection a write went over: only a `WAIT` on the same one can confirm it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Via {
    /// The link's connection of this generation (a single server, or the primary Sentinel
    /// named): a new one is opened only when the last one broke.
    Link(u64),
    /// One node's connection inside a cluster connection, as that node names it (the cluster
    /// client replaces its node connections on its own: the link's generation cannot tell).
    Node(ServerConn),
    /// A cluster node's connection that the node did not name: no `WAIT` can confirm the write.
    Unknown,
}

/// Where a write went, for the `WAIT` that confirms it.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The connection it went over.
    pub via: Via,
    /// The cluster slot of its keys: the `WAIT` goes to that slot's primary (0 on a server).
    pub slot: u16,
}

/// The connection, shared by the client's clones and its batch driver.
pub(crate) struct Link {
    /// Makes connections (standalone or cluster, AUTH, TLS).
    connector: Connector,
    /// The live connection and its generation; None until first use and after it broke.
    conn: Mutex<Option<(Conn, u64)>>,
    /// Connections opened so far: a WAIT confirms only the writes of its own connection.
    opened: std::sync::atomic::AtomicU64,
    /// One reconnection at a time: the others wait for it and use its connection.
    connecting: tokio::sync::Mutex<()>,
    /// Reconnections that failed so far, and the last one's error: a call that waited for a
    /// reconnection that failed answers with its error rather than trying again (each try may
    /// take `redis.connect_timeout`, and calls queued behind a stalled Redis would otherwise
    /// wait one timeout per caller ahead of them).
    failed: Mutex<(u64, Option<redis::RedisError>)>,
    /// Prefix of the request path's own keys (`redis.state_prefix`).
    prefix: String,
}

impl Link {
    /// A link for `config`; connects on first use.
    pub(crate) fn new(config: &RedisConfig) -> Result<Link, RequestError> {
        Ok(Link {
            // No retry that could run a script twice: its outcome is reported unknown instead.
            connector: Connector::new(config)?.without_retries()?,
            conn: Mutex::new(None),
            opened: std::sync::atomic::AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            failed: Mutex::new((0, None)),
            prefix: config.state_prefix.clone(),
        })
    }

    /// Prefix of the request path's own keys.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the deployment is a cluster (script calls are batched per slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.connector, Connector::Cluster { .. })
    }

    pub(crate) async fn conn(&self) -> Result<Conn, RequestError> {
        Ok(self.conn_and_generation().await?.0)
    }

    /// The live connection (opened if there is none) and its generation.
    pub(crate) async fn conn_and_generation(&self) -> Result<(Conn, u64), RequestError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let failures = self.failed().0;
        let _one = self.connecting.lock().await;
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        if let (n, Some(e)) = &*self.failed() {
            if *n != failures {
                return Err(RequestError::Unreachable(e.clone()));
            }
        }
        let conn = self.connector.connect().await.map_err(|e| {
            let mut failed = self.failed();
            *failed = (failed.0 + 1, Some(e.clone()));
            RequestError::Unreachable(e)
        })?;
        let generation = self
            .opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some((conn.clone(), generation));
        Ok((conn, generation))
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, (u64, Option<redis::RedisError>)> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<(Conn, u64)> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Run `cmd`, returning the generation of the connection it ran on too.
    pub(crate) async fn query_on<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
    ) -> Result<(T, u64), RequestError> {
        let (mut conn, generation) = self.conn_and_generation().await?;
        let result = conn.query(cmd).await;
        Ok((self.check(result)?, generation))
    }

    /// Run `cmd`, a write (an invocation of `script`, or a plain command), and say which
    /// connection it went over.
    pub(crate) async fn run_traced(
        &self,
        script: Option<&Script>,
        cmd: &Cmd,
    ) -> Result<(Value, Written), RequestError> {
        let (mut conn, generation) = self.conn_and_generation().await?;
        let slot = first_key(cmd).map_or(0, crate::model::layout::key_slot);
        let on_node = |(reply, conn): (Value, Option<ServerConn>)| {
            (reply, conn.map_or(Via::Unknown, Via::Node))
        };
        let result = match (&conn, script) {
            (Conn::Single(_), Some(script)) => script
                .run(&mut conn, cmd)
                .await
                .map(|reply| (reply, Via::Link(generation))),
            (Conn::Single(_), None) => conn
                .query(cmd)
                .await
                .map(|reply| (reply, Via::Link(generation))),
            (Conn::Cluster(_), Some(script)) => {
                script.run_traced(&mut conn, cmd).await.map(on_node)
            }
            (Conn::Cluster(_), None) => conn.query_traced(cmd).await.map(on_node),
        };
        let (reply, via) = self.check(result)?;
        Ok((reply, Written { via, slot }))
    }

    /// `WAIT replicas ms` on the connection `written` names: on a cluster, sent to the primary
    /// of its slot only. The replicas that acknowledged, and the connection it ran on.
    pub(crate) async fn wait(
        &self,
        written: &Written,
        replicas: u32,
        ms: u64,
    ) -> Result<(i64, Via), RequestError> {
        if let Via::Link(_) = written.via {
            let (acked, generation) = self
                .query_on::<i64>(redis::cmd("WAIT").arg(replicas).arg(ms))
                .await?;
            return Ok((acked, Via::Link(generation)));
        }
        let mut conn = self.conn().await?;
        let result = conn.wait_on_slot(written.slot, replicas, ms).await;
        let (acked, on) = self.check(result)?;
        Ok((acked, on.map_or(Via::Unknown, Via::Node)))
    }

    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, RequestError> {
        let mut conn = self.conn().await?;
        let result = script.run(&mut conn, cmd).await;
        self.check(result)
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
        let mut conn = self.conn().await?;
        let result = conn.query(cmd).await;
        self.check(result)
    }

    fn check<T>(&self, result: redis::RedisResult<T>) -> Result<T, RequestError> {
        result.map_err(|e| {
            self.forget(&e);
            e.into()
        })
    }

    pub(crate) fn forget(&self, e: &redis::RedisError) {
        // READONLY: the server was a primary and is now a replica (a failover demoted it); a
        // new connection finds the new primary (through Sentinel, or the same address).
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.code() == Some("READONLY")
        {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

/// The first key of `cmd`: after the key count of EVAL/EVALSHA, else its first argument.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let arg = |i: usize| match cmd.args_iter().nth(i)? {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    };
    let name = arg(0)?;
    if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        arg(3)
    } else {
        arg(1)
    }
}

#[cfg(test)]
mod tests {
    use super::first_key;

    #[test]
    fn the_first_key_of_a_script_call_or_a_command() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc").arg(2).arg("k1").arg("k2").arg("v");
        assert_eq!(first_key(&eval), Some(&b"k1"[..]));
        let mut del = redis::cmd("DEL");
        del.arg("k3");
        assert_eq!(first_key(&del), Some(&b"k3"[..]));
        assert_eq!(first_key(&redis::cmd("PING")), None);
    }
}
