//! One shared connection for every primitive. Requests from many tasks are multiplexed (and so
//! pipelined) over it; when it breaks, the next call opens a new one. Script calls that find
//! every in-flight slot taken are batched (`batch.rs`).

use std::sync::{Arc, Mutex};

use redis::{Cmd, FromRedisValue};

use super::batch::{Batcher, Batching, ScriptPair};
use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::{Conn, Connector};
use crate::script::Script;

/// A cheap-to-clone handle on a Redis server or cluster.
#[derive(Clone)]
pub struct Client {
    link: Arc<Link>,
    batch: Arc<Batcher>,
}

/// The connection, shared by the client's clones and its batch driver.
pub(crate) struct Link {
    connector: Connector,
    conn: Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    prefix: String,
}

impl Client {
    /// A client for `config` (standalone or cluster, AUTH, TLS); connects on first use. Keys of
    /// the request path start with `config.state_prefix`.
    pub fn new(config: &RedisConfig) -> Result<Client, RequestError> {
        Client::with_batching(config, Batching::default())
    }

    /// A client as [`Client::new`] that batches concurrent script calls as `batching` says.
    pub fn with_batching(config: &RedisConfig, batching: Batching) -> Result<Client, RequestError> {
        Ok(Client {
            link: Arc::new(Link {
                connector: Connector::new(config)?,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                prefix: config.state_prefix.clone(),
            }),
            batch: Arc::new(Batcher::new(batching)),
        })
    }

    /// Prefix of the request path's own keys.
    pub fn prefix(&self) -> &str {
        &self.link.prefix
    }

    /// The live connection, opened if there is none.
    pub async fn conn(&self) -> Result<Conn, RequestError> {
        self.link.conn().await
    }

    /// Run `cmd`, an invocation of `script` (NOSCRIPT: load and run again). A broken connection
    /// is dropped so that the next call reconnects; a timeout is not a broken connection (the
    /// request may still run: only an idempotency key makes retrying it safe).
    pub async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, RequestError> {
        self.link.run(script, cmd).await
    }

    /// Run one call of `pair` with `keys` and ARGV `args`, batched with concurrent calls when
    /// every in-flight slot is taken. The reply is this call's own, whether batched or not.
    pub(crate) async fn run_batched(
        &self,
        pair: &'static ScriptPair,
        keys: Vec<String>,
        args: Cmd,
    ) -> Result<redis::Value, RequestError> {
        self.batch.run(&self.link, pair, keys, args).await
    }

    /// Run a plain command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
        self.link.query(cmd).await
    }

    /// After `e` from a connection this client handed out: drop the connection if it is
    /// broken, so that the next call reconnects.
    pub fn forget(&self, e: &redis::RedisError) {
        self.link.forget(e)
    }
}

impl Link {
    /// Whether the deployment is a cluster (script calls are batched per slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.connector, Connector::Cluster { .. })
    }

    async fn conn(&self) -> Result<Conn, RequestError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let _one = self.connecting.lock().await;
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let conn = self
            .connector
            .connect()
            .await
            .map_err(RequestError::Unreachable)?;
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    fn current(&self) -> Option<Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
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

    fn forget(&self, e: &redis::RedisError) {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}
