//! One shared connection for every primitive. Requests from many tasks are multiplexed (and so
//! pipelined) over it; when it breaks, the next call opens a new one.

use std::sync::{Arc, Mutex};

use redis::{Cmd, FromRedisValue};

use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::{Conn, Connector};
use crate::script::Script;

/// A cheap-to-clone handle on a Redis server or cluster.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    conn: Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    prefix: String,
}

impl Client {
    /// A client for `config` (standalone or cluster, AUTH, TLS); connects on first use. Keys of
    /// the request path start with `config.state_prefix`.
    pub fn new(config: &RedisConfig) -> Result<Client, RequestError> {
        Ok(Client {
            inner: Arc::new(Inner {
                connector: Connector::new(config)?,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: config.state_prefix.clone(),
            }),
        })
    }

    /// Prefix of the request path's own keys.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The live connection, opened if there is none.
    pub async fn conn(&self) -> Result<Conn, RequestError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let _one = self.inner.connecting.lock().await;
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let conn = self
            .inner
            .connector
            .connect()
            .await
            .map_err(RequestError::Unreachable)?;
        *self.inner.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    fn current(&self) -> Option<Conn> {
        self.inner
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Run `cmd`, an invocation of `script` (NOSCRIPT: load and run again). A broken connection
    /// is dropped so that the next call reconnects; a timeout is not a broken connection (the
    /// request may still run: only an idempotency key makes retrying it safe).
    pub async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, RequestError> {
        let mut conn = self.conn().await?;
        let result = script.run(&mut conn, cmd).await;
        self.check(result)
    }

    /// Run a plain command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
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

    /// After `e` from a connection this client handed out: drop the connection if it is
    /// broken, so that the next call reconnects.
    pub fn forget(&self, e: &redis::RedisError) {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            *self.inner.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}
