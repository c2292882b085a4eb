//! One Redis connection handle for either deployment. Both kinds multiplex requests over their
//! connections and are cheap to clone; the cluster one follows MOVED/ASK and refreshes slots.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::{
    AsyncConnectionConfig, Client, Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, Value,
};

use crate::config::{RedisConfig, RedisMode};

/// Builds connections; holds no socket itself.
#[derive(Clone)]
pub enum Connector {
    /// A single server.
    Single(Client, AsyncConnectionConfig),
    /// The primary Redis Sentinel names (`redis.sentinels`, `redis.master_name`).
    Sentinel(Sentinel),
    /// Redis Cluster seeded from a list of nodes.
    Cluster {
        /// Seeded from every node.
        client: ClusterClient,
        /// The client's own retries after a failed send (4; 0 for the request path).
        retries: u32,
        /// Each seed's settings, in `seed_clients` order (to seed from some of them).
        infos: Vec<redis::ConnectionInfo>,
        /// Connect and response timeouts, for a client seeded from some of them.
        timeouts: (Duration, Duration),
    },
}

mod sentinel;
pub use sentinel::Sentinel;
mod stuck;
pub use stuck::Cluster;
mod routed;
pub use routed::ServerConn;

/// A live connection.
#[derive(Clone)]
pub enum Conn {
    /// To a single server.
    Single(MultiplexedConnection),
    /// To a cluster (a request on a client that stopped answering fails at once: see
    /// [`Cluster`]).
    Cluster(Cluster),
}

/// The cluster client's own retries on the stream path (whose flushes are idempotent).
const STREAM_RETRIES: u32 = 4;

/// A client for one server, with the config's user, password and TLS files applied.
pub fn client(config: &RedisConfig) -> Result<Client, RedisError> {
    let info = connection_info(&config.url, config)?;
    match tls_certificates(config)? {
        Some(certs) => Client::build_with_tls(info, certs),
        None => Client::open(info),
    }
}

/// Certificates from `tls_ca_file` / `tls_cert_file` / `tls_key_file`, if any is set.
fn tls_certificates(config: &RedisConfig) -> Result<Option<redis::TlsCertificates>, RedisError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            RedisError::from(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ))
        })
    };
    if config.tls_ca_file.is_none() && config.tls_cert_file.is_none() {
        return Ok(None);
    }
    let root_cert = config.tls_ca_file.as_deref().map(read).transpose()?;
    let client_tls = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        _ => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The connection settings for `url` with the config's user and password applied.
pub fn connection_info(
    url: &str,
    config: &RedisConfig,
) -> Result<redis::ConnectionInfo, RedisError> {
    use redis::IntoConnectionInfo;
    let mut info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    Ok(info)
}

/// The cluster seed nodes: `nodes`, or `url` when it is empty.
fn seeds(config: &RedisConfig) -> Vec<&str> {
    if config.nodes.is_empty() {
        vec![config.url.as_str()]
    } else {
        config.nodes.iter().map(String::as_str).collect()
    }
}

/// Clients for each cluster seed node (`nodes`, or `url` when it is empty), each talking to that
/// node only (no redirects): for probing the cluster's own view of its topology.
pub fn seed_clients(config: &RedisConfig) -> Result<Vec<Client>, RedisError> {
    seeds(config)
        .iter()
        .map(|u| Client::open(connection_info(u, config)?))
        .collect()
}

/// Clients for each sentinel (`sentinels`), to ask them where the primary is. The sentinels
/// take no user or password here (as for the connector's own sentinel client).
pub fn sentinel_clients(config: &RedisConfig) -> Result<Vec<Client>, RedisError> {
    config
        .sentinels
        .iter()
        .map(|u| Client::open(u.as_str()))
        .collect()
}

/// A cluster client seeded from `infos`, with these (connect, response) timeouts and, after a
/// failed send, at most `retries` more tries.
fn cluster_client(
    infos: Vec<redis::ConnectionInfo>,
    (connect_timeout, response_timeout): (Duration, Duration),
    retries: u32,
) -> Result<ClusterClient, RedisError> {
    // rediss:// seeds use TLS with the system trust store (config validation refuses custom
    // certificate files in cluster mode).
    ClusterClient::builder(infos)
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        // tally retries whole flushes itself (they are idempotent); keep the client's own
        // redirect/refresh retries short so failures surface. The request path asks for none
        // (see `Connector::without_retries`).
        .retries(retries)
        // And quick: the client's default waits at least 1.28 s before each retry, so a
        // request caught by a failover surfaced ~5 s later and counting resumed ~7 s after the
        // promotion. Now 10 ms to 200 ms each (≤ 0.6 s for all four).
        .min_retry_wait(10)
        .max_retry_wait(200)
        .retry_wait_formula(25, 2)
        .build()
}

impl Connector {
    /// A connector for the configured deployment; fails only on malformed settings.
    pub fn new(config: &RedisConfig) -> Result<Connector, RedisError> {
        match config.mode {
            RedisMode::Standalone => Ok(Connector::Single(
                client(config)?,
                AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout)),
            )),
            RedisMode::Sentinel => {
                // The primary's user and password (the sentinels take none here).
                let node = connection_info("redis://127.0.0.1", config)?;
                Ok(Connector::Sentinel(Sentinel::new(
                    sentinel_clients(config)?,
                    config.master_name.clone(),
                    node.redis_settings().clone(),
                    AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(config.connect_timeout))
                        .set_response_timeout(Some(config.response_timeout)),
                    config.connect_timeout,
                )))
            }
            RedisMode::Cluster => {
                let infos = seeds(config)
                    .iter()
                    .map(|u| connection_info(u, config))
                    .collect::<Result<Vec<_>, _>>()?;
                let timeouts = (config.connect_timeout, config.response_timeout);
                Ok(Connector::Cluster {
                    client: cluster_client(infos.clone(), timeouts, STREAM_RETRIES)?,
                    retries: STREAM_RETRIES,
                    infos,
                    timeouts,
                })
            }
        }
    }

    /// This connector without the cluster client's own retries: a request-path script whose
    /// reply was lost may have run, and sending it again (a quota take, a hit, a limit charge)
    /// would run it twice; the caller gets the first error (its outcome unknown) instead.
    pub fn without_retries(self) -> Result<Connector, RedisError> {
        match self {
            Connector::Cluster {
                infos, timeouts, ..
            } => Ok(Connector::Cluster {
                client: cluster_client(infos.clone(), timeouts, 0)?,
                retries: 0,
                infos,
                timeouts,
            }),
            single => Ok(single),
        }
    }

    /// Open a connection.
    pub async fn connect(&self) -> RedisResult<Conn> {
        match self {
            Connector::Single(client, config) => Ok(Conn::Single(
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            )),
            Connector::Sentinel(s) => {
                // Asking the sentinels is bounded too.
                match tokio::time::timeout(s.connect_timeout(), s.connect()).await {
                    Ok(conn) => Ok(Conn::Single(conn?)),
                    Err(_) => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no primary from the sentinels in time",
                    ))),
                }
            }
            Connector::Cluster { client, .. } => Ok(Conn::Cluster(Cluster::new(
                client.get_async_connection().await?,
            ))),
        }
    }

    /// Open a connection seeded from some of the seed nodes only (indices in `seed_clients`
    /// order): a new cluster connection waits for every seed it is given, so a frozen one
    /// (it accepts connections, never answers) would hold it for the connect timeout.
    pub async fn connect_via(&self, seeds: &[usize]) -> RedisResult<Conn> {
        let Connector::Cluster {
            infos,
            timeouts,
            retries,
            ..
        } = self
        else {
            return self.connect().await;
        };
        let some: Vec<_> = seeds
            .iter()
            .filter_map(|&i| infos.get(i).cloned())
            .collect();
        if some.is_empty() {
            return self.connect().await;
        }
        let client = cluster_client(some, *timeouts, *retries)?;
        Ok(Conn::Cluster(Cluster::new(
            client.get_async_connection().await?,
        )))
    }
}

impl Conn {
    /// Run a pipeline. On a cluster, every command of `pipe` must map to one slot. A cluster
    /// client that stops answering fails it at once (see [`Cluster`]).
    pub async fn pipe(&mut self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => {
                c.clone()
                    .unless_stuck(pipe.query_async(&mut c.client))
                    .await
            }
        }
    }

    /// Run one command (on a cluster, routed by key, or to all primaries for SCRIPT LOAD), as
    /// [`Conn::pipe`].
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => c.clone().unless_stuck(cmd.query_async(&mut c.client)).await,
        }
    }
}

impl Conn {
    /// Run independent single-key commands in as few round trips as the deployment allows:
    /// one pipeline on a server; on a cluster one pipeline per slot, all at once. `cmds` pairs
    /// each command with its key; the replies come back in `cmds` order.
    pub async fn pipe_keyed(&mut self, cmds: Vec<(Vec<u8>, Cmd)>) -> RedisResult<Vec<Value>> {
        if let Conn::Single(_) = self {
            let mut pipe = redis::pipe();
            for (_, cmd) in cmds {
                pipe.add_command(cmd);
            }
            return self.pipe(&pipe).await;
        }
        let mut by_slot: std::collections::BTreeMap<u16, (Pipeline, Vec<usize>)> =
            Default::default();
        let n = cmds.len();
        for (i, (key, cmd)) in cmds.into_iter().enumerate() {
            let slot = crate::model::layout::key_slot(&key);
            let entry = by_slot
                .entry(slot)
                .or_insert_with(|| (redis::pipe(), Vec::new()));
            entry.0.add_command(cmd);
            entry.1.push(i);
        }
        let replies = futures_join(self, by_slot.values().map(|(p, _)| p)).await;
        let mut out = vec![Value::Nil; n];
        for ((_, idx), reply) in by_slot.values().zip(replies) {
            for (i, v) in idx.iter().zip(reply?) {
                out[*i] = v;
            }
        }
        Ok(out)
    }
}

/// Send pipelines concurrently over clones of `conn` (multiplexed: cheap).
async fn futures_join<'a>(
    conn: &Conn,
    pipes: impl Iterator<Item = &'a Pipeline>,
) -> Vec<RedisResult<Vec<Value>>> {
    let mut set = Vec::new();
    for pipe in pipes {
        let mut c = conn.clone();
        let pipe = pipe.clone();
        set.push(tokio::spawn(async move { c.pipe(&pipe).await }));
    }
    let mut out = Vec::with_capacity(set.len());
    for task in set {
        out.push(
            task.await
                .unwrap_or_else(|e| Err(RedisError::from(std::io::Error::other(e.to_string())))),
        );
    }
    out
}

/// The primaries `(host, port)` of a `CLUSTER SLOTS` reply, each once, in reply order.
pub fn slot_primaries(slots: &Value) -> Vec<(String, u16)> {
    let mut nodes = Vec::new();
    let Value::Array(ranges) = slots else {
        return nodes;
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(primary)) = parts.get(2) else {
            continue;
        };
        let host = match primary.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            _ => continue,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            continue;
        };
        let node = (host, *port as u16);
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes
}

/// One node of a deployment: `None` is the single server; a cluster primary by address.
pub type Node = Option<(String, u16)>;

impl Conn {
    /// The nodes that hold keys: the server, or every cluster primary (from `CLUSTER SLOTS`).
    pub async fn primaries(&mut self) -> RedisResult<Vec<Node>> {
        let Conn::Cluster(c) = self else {
            return Ok(vec![None]);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let slots: Value = c
            .clone()
            .unless_stuck(cmd.query_async(&mut c.client))
            .await?;
        Ok(slot_primaries(&slots).into_iter().map(Some).collect())
    }

    /// Run `cmd` on `node` (a keyless command such as SCAN, sent to that node only).
    pub async fn query_on<T: FromRedisValue>(&mut self, node: &Node, cmd: &Cmd) -> RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let guard = c.clone();
                let v = guard
                    .unless_stuck(c.client.route_command(cmd.clone(), routing))
                    .await?;
                redis::from_redis_value(v).map_err(Into::into)
            }
            (conn, _) => conn.query(cmd).await,
        }
    }
}

impl Conn {
    /// `maxmemory-policy` of the server, or of every node of a cluster, read from `INFO memory`
    /// (allowed where `CONFIG` is not, e.g. on managed services).
    pub async fn eviction_policies(&mut self) -> RedisResult<Vec<String>> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("memory");
        let value: Value = match self {
            Conn::Single(c) => cmd.query_async(c).await?,
            Conn::Cluster(c) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let guard = c.clone();
                guard.unless_stuck(c.client.route_command(cmd, all)).await?
            }
        };
        let mut policies = Vec::new();
        collect_policies(&value, &mut policies);
        Ok(policies)
    }
}

fn collect_policies(value: &Value, out: &mut Vec<String>) {
    let mut text = |bytes: &[u8]| {
        for line in String::from_utf8_lossy(bytes).lines() {
            if let Some(policy) = line.trim().strip_prefix("maxmemory_policy:") {
                out.push(policy.to_string());
            }
        }
    };
    match value {
        Value::BulkString(b) => text(b),
        Value::SimpleString(s) => text(s.as_bytes()),
        Value::VerbatimString { text: t, .. } => text(t.as_bytes()),
        Value::Array(items) | Value::Set(items) => {
            for v in items {
                collect_policies(v, out);
            }
        }
        Value::Map(pairs) => {
            for (_, v) in pairs {
                collect_policies(v, out);
            }
        }
        _ => {}
    }
}
