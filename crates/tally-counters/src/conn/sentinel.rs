//! Finding the primary through Redis Sentinel, as the Sentinel client guidelines describe it:
//! ask the sentinels `SENTINEL get-master-addr-by-name`, connect to the address named, and keep
//! it only if `ROLE` says it is a primary.
//!
//! redis-rs' own Sentinel client reads `SENTINEL MASTERS` instead and refuses a primary whose
//! entry is still flagged `o_down` or in failover. A sentinel names the promoted replica (and the
//! replica is a primary already) as soon as the failover reaches the reconfiguration of the
//! other replicas, but clears those flags only when the failover ends: measured with three
//! redis-sentinel 7.0 and one replica, that left every write refused ("master with given name
//! not found") for about a second after the first sentinel named the new primary.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult, Value};

/// A primary found through Redis Sentinel: asked of the sentinels on every connect.
#[derive(Clone)]
pub struct Sentinel {
    /// One client per sentinel (`redis.sentinels`).
    sentinels: Vec<Client>,
    /// `redis.master_name`.
    master_name: String,
    /// The primary's user and password.
    settings: redis::RedisConnectionInfo,
    config: AsyncConnectionConfig,
    /// `redis.connect_timeout`: bounds the primary's connection; half of it each sentinel's
    /// answer.
    timeout: Duration,
}

impl Sentinel {
    pub(super) fn new(
        sentinels: Vec<Client>,
        master_name: String,
        settings: redis::RedisConnectionInfo,
        config: AsyncConnectionConfig,
        timeout: Duration,
    ) -> Sentinel {
        Sentinel {
            sentinels,
            master_name,
            settings,
            config,
            timeout,
        }
    }

    /// A connection to the primary the sentinels name. Every sentinel is asked at once, and
    /// their answers are counted as they come: once a majority of the configured sentinels
    /// names one address, the rest are not waited for (a frozen or unreachable sentinel costs
    /// nothing then); otherwise every answer is waited for, each at most half the connect
    /// timeout. The addresses named are tried most named first, and the first whose `ROLE` is
    /// `master` wins.
    pub(super) async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        let majority = self.sentinels.len() / 2 + 1;
        let mut asks: FuturesUnordered<_> = self.sentinels.iter().map(|s| self.ask(s)).collect();
        let mut candidates: Vec<(String, u16, usize)> = Vec::new();
        while let Some(answer) = asks.next().await {
            let Some((host, port)) = answer else { continue };
            let named = match candidates.iter_mut().find(|c| c.0 == host && c.1 == port) {
                Some(c) => {
                    c.2 += 1;
                    c.2
                }
                None => {
                    candidates.push((host, port, 1));
                    1
                }
            };
            if named >= majority {
                break;
            }
        }
        // Stable: among equals, the first to answer.
        candidates.sort_by_key(|c| std::cmp::Reverse(c.2));
        let mut last = None;
        for (host, port, _) in candidates {
            match self.primary_at(&host, port).await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel names a primary",
                self.master_name.clone(),
            ))
        }))
    }

    /// The address one sentinel names, if it answers in time and knows the name.
    async fn ask(&self, sentinel: &Client) -> Option<(String, u16)> {
        let ask = async {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            let mut conn = sentinel
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            let reply: Value = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query_async(&mut conn)
                .await
                .ok()?;
            let (host, port): (String, String) = redis::from_redis_value(reply).ok()?;
            Some((host, port.parse().ok()?))
        };
        // Without a majority every sentinel is waited for: a frozen one gets half the connect
        // timeout, leaving the other half (of the two `connect` is given) for the primary's
        // connection.
        tokio::time::timeout(self.timeout / 2, ask).await.ok()?
    }

    /// A connection to `host:port` if it is a primary.
    async fn primary_at(&self, host: &str, port: u16) -> RedisResult<MultiplexedConnection> {
        use redis::IntoConnectionInfo;
        let url = if host.contains(':') {
            format!("redis://[{host}]:{port}")
        } else {
            format!("redis://{host}:{port}")
        };
        let info = url
            .into_connection_info()?
            .set_redis_settings(self.settings.clone());
        let client = Client::open(info)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        let is_primary = match &role {
            Value::Array(parts) => {
                matches!(parts.first(), Some(Value::BulkString(b)) if b.as_slice() == b"master")
            }
            _ => false,
        };
        if !is_primary {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "the address a sentinel names is not a primary (yet)",
                format!("{host}:{port}"),
            )));
        }
        Ok(conn)
    }

    /// Twice the connect timeout: the sentinels' answer, then the primary's connection.
    pub(super) fn connect_timeout(&self) -> Duration {
        self.timeout * 2
    }
}
