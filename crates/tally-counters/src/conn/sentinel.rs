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
    /// timeout. The addresses are tried in [`ranked`] order and the first whose `ROLE` is
    /// `master` wins: which sentinel answered first never decides.
    pub(super) async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        let majority = self.sentinels.len() / 2 + 1;
        let mut asks: FuturesUnordered<_> = self.sentinels.iter().map(|s| self.ask(s)).collect();
        let mut answers: Vec<Named> = Vec::new();
        while let Some(answer) = asks.next().await {
            let Some(named) = answer else { continue };
            let agreeing = 1 + answers.iter().filter(|a| a.addr == named.addr).count();
            answers.push(named);
            if agreeing >= majority {
                break;
            }
        }
        let mut last = None;
        for (host, port) in ranked(&answers) {
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

    /// The address one sentinel names and the configuration epoch it has for the name, if it
    /// answers in time and knows the name.
    async fn ask(&self, sentinel: &Client) -> Option<Named> {
        let ask = async {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            let mut conn = sentinel
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            // One round trip. `get-master-addr-by-name` is the address to use: it names the
            // promoted replica as soon as the failover reconfigures the others, when
            // `SENTINEL MASTER` still shows the old one; the epoch comes from the latter (the
            // leader raises it at that same moment). A sentinel whose ACL refuses `MASTER`
            // still names an address, with epoch 0.
            let (addr, master): (Value, Value) = redis::pipe()
                .cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .cmd("SENTINEL")
                .arg("master")
                .arg(&self.master_name)
                .query_async(&mut conn)
                .await
                .ok()?;
            let (host, port): (String, String) = redis::from_redis_value(addr).ok()?;
            Some(Named {
                addr: (host, port.parse().ok()?),
                epoch: config_epoch(master).unwrap_or(0),
            })
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

/// What one sentinel answered: the primary's address and the configuration epoch it knows.
#[derive(Clone, Debug, PartialEq)]
struct Named {
    addr: (String, u16),
    /// `config-epoch`: raised by every failover, so a sentinel that missed one has a lower one.
    epoch: u64,
}

/// The order to try the addresses the sentinels named: most named first; among as many names,
/// the highest configuration epoch first (a sentinel that missed a failover still names the
/// deposed primary, which may still say `ROLE master` to a client it is not cut off from); then
/// by address. Never by who answered first.
fn ranked(answers: &[Named]) -> Vec<(String, u16)> {
    let mut candidates: Vec<((String, u16), usize, u64)> = Vec::new();
    for a in answers {
        match candidates.iter_mut().find(|c| c.0 == a.addr) {
            Some(c) => {
                c.1 += 1;
                c.2 = c.2.max(a.epoch);
            }
            None => candidates.push((a.addr.clone(), 1, a.epoch)),
        }
    }
    candidates.sort_by(|x, y| y.1.cmp(&x.1).then(y.2.cmp(&x.2)).then(x.0.cmp(&y.0)));
    candidates.into_iter().map(|c| c.0).collect()
}

/// `config-epoch` from a `SENTINEL MASTER` reply (a flat list of names and values in RESP2, a
/// map in RESP3).
fn config_epoch(reply: Value) -> Option<u64> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut it = items.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        _ => return None,
    };
    pairs.into_iter().find_map(|(k, v)| {
        let k: String = redis::from_redis_value(k).ok()?;
        if k != "config-epoch" {
            return None;
        }
        let v: String = redis::from_redis_value(v).ok()?;
        v.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(port: u16, epoch: u64) -> Named {
        Named {
            addr: ("127.0.0.1".into(), port),
            epoch,
        }
    }

    #[test]
    fn a_tie_goes_to_the_newest_epoch_whoever_answered_first() {
        // A stale sentinel (epoch 3, the deposed primary) answered before an honest one
        // (epoch 4, the promoted replica).
        let stale_first = [named(6001, 3), named(6002, 4)];
        let honest_first = [named(6002, 4), named(6001, 3)];
        assert_eq!(ranked(&stale_first)[0].1, 6002);
        assert_eq!(ranked(&honest_first)[0].1, 6002);
    }

    #[test]
    fn the_most_named_comes_first_then_epoch_then_address() {
        let answers = [
            named(7003, 9),
            named(7001, 2),
            named(7001, 2),
            named(7002, 1),
        ];
        let order: Vec<u16> = ranked(&answers).into_iter().map(|a| a.1).collect();
        assert_eq!(order, [7001, 7003, 7002]);
        let even = [named(7002, 5), named(7001, 5)];
        let order: Vec<u16> = ranked(&even).into_iter().map(|a| a.1).collect();
        assert_eq!(order, [7001, 7002]);
    }

    #[test]
    fn the_epoch_is_read_from_either_protocol() {
        let s = |x: &str| Value::BulkString(x.as_bytes().to_vec());
        let resp2 = Value::Array(vec![s("name"), s("m"), s("config-epoch"), s("7")]);
        assert_eq!(config_epoch(resp2), Some(7));
        let resp3 = Value::Map(vec![(s("config-epoch"), s("12")), (s("ip"), s("x"))]);
        assert_eq!(config_epoch(resp3), Some(12));
        assert_eq!(config_epoch(Value::Nil), None);
    }
}
