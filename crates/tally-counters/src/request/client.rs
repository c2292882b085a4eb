//! One shared connection for every primitive. Requests from many tasks are multiplexed (and so
//! pipelined) over it; when it breaks, the next call opens a new one. Script calls that find
//! every in-flight slot taken are batched (`batch.rs`).

use std::sync::Arc;

use redis::{Cmd, FromRedisValue};

use super::batch::{Batcher, Batching, ScriptPair};
use super::confirm::{Confirmers, Durability};
use super::link::{Link, Written};
use super::RequestError;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::script::Script;

/// A cheap-to-clone handle on a Redis server or cluster.
#[derive(Clone)]
pub struct Client {
    link: Arc<Link>,
    batch: Arc<Batcher>,
    /// What a script call waits for before it answers.
    durability: Durability,
    /// Shares one WAIT among concurrent calls (one per durability level).
    confirmers: Arc<Confirmers>,
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
            confirmers: Arc::default(),
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

    /// Whether writes wait for replicas (and so must say where they went).
    fn durable_writes(&self) -> bool {
        self.durability.replicas > 0
    }

    /// Send a write (`script`'s call, or a plain command); where it went when it must be
    /// confirmed. An error past the send is an unknown outcome unless Redis refused it.
    async fn send(
        &self,
        script: Option<&Script>,
        cmd: &Cmd,
    ) -> Result<(redis::Value, Option<Written>), RequestError> {
        let sent = if self.durable_writes() {
            self.link
                .run_traced(script, cmd)
                .await
                .map(|(reply, written)| (reply, Some(written)))
        } else {
            match script {
                Some(script) => self.link.run(script, cmd).await,
                None => self.link.query(cmd).await,
            }
            .map(|reply| (reply, None))
        };
        sent.map_err(super::unknown_unless_refused)
    }

    /// After a call that wrote: wait for the replicas `durability` asks for, in a WAIT shared
    /// with the calls written over the same connection and confirming now (per durability
    /// level and connection, shared by every clone).
    async fn confirm(&self, written: Option<Written>) -> Result<(), RequestError> {
        let Some(written) = written else {
            return Ok(());
        };
        self.confirmers
            .of(self.durability, &written.via)
            .confirm(&self.link, self.durability, written)
            .await
    }

    /// Prefix of the request path's own keys.
    pub fn prefix(&self) -> &str {
        self.link.prefix()
    }

    /// The live connection, opened if there is none.
    pub async fn conn(&self) -> Result<Conn, RequestError> {
        self.link.conn().await
    }

    /// Run `cmd`, an invocation of `script` that writes (NOSCRIPT: load and run again). A broken
    /// connection is dropped so that the next call reconnects; a timeout is not a broken
    /// connection (the request may still run: only an idempotency key makes retrying it safe).
    /// An error after the send that Redis did not give instead of running it is
    /// [`RequestError::OutcomeUnknown`]: the script may have run.
    pub async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, RequestError> {
        let (reply, written) = self.send(Some(script), cmd).await?;
        let reply = parse(reply)?;
        self.confirm(written).await?;
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
        let traced = self.durable_writes();
        let (reply, written) = self.batch.run(&self.link, pair, keys, args, traced).await?;
        self.confirm(written).await?;
        Ok(reply)
    }

    /// Run a plain command that writes, answered once the durability level holds (as for a
    /// script call); its outcome unknown after an error past the send, as for a script.
    pub async fn write<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RequestError> {
        let (reply, written) = self.send(None, cmd).await?;
        let reply = parse(reply)?;
        self.confirm(written).await?;
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

/// A write's reply as the caller's type; a reply it cannot be is an unknown outcome (the write
/// ran, its answer is unreadable).
fn parse<T: FromRedisValue>(reply: redis::Value) -> Result<T, RequestError> {
    redis::from_redis_value(reply)
        .map_err(|e| RequestError::OutcomeUnknown(redis::RedisError::from(e)))
}
