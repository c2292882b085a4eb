//! One shared connection for every primitive. Requests from many tasks are multiplexed (and so
//! pipelined) over it; when it breaks, the next call opens a new one. Script calls that find
//! every in-flight slot taken are batched (`batch.rs`).

use std::sync::Arc;

use redis::{Cmd, FromRedisValue};

use super::batch::{Batcher, Batching, ScriptPair};
use super::link::Link;
use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::script::Script;

/// How many replicas must have a write before a call is answered (`WAIT replicas timeout`
/// after the script). Redis replicates asynchronously: a primary can acknowledge a write and
/// die before any replica has it, and a failover then undoes an admission that was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Durability {
    /// Replicas that must have the write; 0: answer as soon as the primary has it.
    pub replicas: u32,
    /// How long to wait for them; then the answer is [`RequestError::NotReplicated`] (the
    /// write stays on the primary: a quota item taken, a limit charged, never granted).
    #[serde(with = "humantime_serde")]
    pub timeout: std::time::Duration,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            replicas: 0,
            timeout: std::time::Duration::from_millis(100),
        }
    }
}

/// A cheap-to-clone handle on a Redis server or cluster.
#[derive(Clone)]
pub struct Client {
    link: Arc<Link>,
    batch: Arc<Batcher>,
    /// What a script call waits for before it answers.
    durability: Durability,
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
            link: Arc::new(Link::new(config)?),
            batch: Arc::new(Batcher::new(batching)),
            durability: Durability::default(),
        })
    }

    /// This client (the same connection and batches) answering script calls only once
    /// `durability` holds.
    pub fn durable(&self, durability: Durability) -> Client {
        Client {
            durability,
            ..self.clone()
        }
    }

    /// What this client's script calls wait for.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// After a script call that wrote: `WAIT` for the replicas `durability` asks for (on the
    /// connection the call used: WAIT covers every write made on it before).
    async fn confirm(&self) -> Result<(), RequestError> {
        let Durability { replicas, timeout } = self.durability;
        if replicas == 0 {
            return Ok(());
        }
        let ms = timeout.as_millis().max(1) as u64;
        let acked: i64 = self
            .link
            .query(redis::cmd("WAIT").arg(replicas).arg(ms))
            .await?;
        if acked < i64::from(replicas) {
            return Err(RequestError::NotReplicated {
                wanted: replicas,
                acked: acked.max(0) as u32,
            });
        }
        Ok(())
    }

    /// Prefix of the request path's own keys.
    pub fn prefix(&self) -> &str {
        self.link.prefix()
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
        let reply = self.link.run(script, cmd).await?;
        self.confirm().await?;
        Ok(reply)
    }

    /// Run one call of `pair` with `keys` and ARGV `args`, batched with concurrent calls when
    /// every in-flight slot is taken. The reply is this call's own, whether batched or not.
    pub(crate) async fn run_batched(
        &self,
        pair: &'static ScriptPair,
        keys: Vec<String>,
        args: Cmd,
    ) -> Result<redis::Value, RequestError> {
        let reply = self.batch.run(&self.link, pair, keys, args).await?;
        self.confirm().await?;
        Ok(reply)
    }

    /// Run a plain command that writes, answered once the durability level holds (as for a
    /// script call).
    pub async fn write<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
        let reply = self.link.query(cmd).await?;
        self.confirm().await?;
        Ok(reply)
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
