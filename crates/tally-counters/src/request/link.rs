//! The connection under a [`super::Client`], shared by the client's clones and its batch
//! driver: opened on first use, dropped when it breaks so that the next call reconnects.

use std::sync::Mutex;

use redis::{Cmd, FromRedisValue};

use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::{Conn, Connector};
use crate::script::Script;

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
