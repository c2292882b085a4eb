//! Following a cluster failover at once. Once a flush failed or has run for [`SLOW_ATTEMPT`],
//! and until one lands, the sink asks the seed nodes every [`POLL`] which primaries serve slots
//! (`CLUSTER SLOTS`, straight to each node) and reacts as soon as one answers with a set of
//! primaries not seen when the watch was armed, e.g. a replica promoted in place of a dead
//! primary: the retry's backoff wait ends, and an attempt in flight is abandoned (a request
//! caught by the failover may otherwise hang until its response timeout). Measured before (five
//! failovers, node timeout 2 s): counting resumed 0.65-2.4 s after the promotion, spent in the
//! grown backoff (1-3 s by then) and in attempts waiting on the dead primary; with it, within
//! ~[`POLL`] plus one flush. Fence reads (partitions being opened, e.g. in a rebalance) run
//! under the same watch ([`watched`]). While the watch is armed the sink reconnects only through
//! the seeds that answered it ([`TopologyWatch::answering`]): a frozen seed held every new
//! cluster connection for the connect timeout (counting resumed ~5.4 s after the promotion).
//!
//! On Redis Sentinel the watch asks the sentinels instead (`SENTINEL get-master-addr-by-name`):
//! a retry's backoff (grown to 1.6-3.2 s by the time the sentinels have agreed on a failure and
//! promoted a replica, with the default `flush.retry_*`) ends as soon as one of them names
//! another primary.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

/// How often the seed nodes are asked while a retry waits.
pub const POLL: Duration = Duration::from_millis(50);
/// A flush attempt running longer arms the watch (a healthy one takes milliseconds).
pub const SLOW_ATTEMPT: Duration = Duration::from_millis(250);
/// Bound on connecting to and hearing from one seed node (a dead or stalled one is skipped).
const NODE_TIMEOUT: Duration = Duration::from_millis(250);

/// One node's view: the addresses of the primaries that serve slots, sorted. A failover changes
/// it (a replica becomes a primary); resharding between the same primaries does not (the
/// cluster client follows MOVED/ASK by itself, so abandoning attempts then would only add
/// retries).
type Assignment = Vec<String>;

/// What the watch asks each node.
#[derive(Clone)]
pub enum Watched {
    /// A cluster node: which primaries serve slots (`CLUSTER SLOTS`).
    Cluster,
    /// A sentinel: where the primary of this master name is.
    Sentinel(String),
}

impl Watched {
    fn command(&self) -> redis::Cmd {
        match self {
            Watched::Cluster => {
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("SLOTS");
                cmd
            }
            Watched::Sentinel(name) => {
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg("get-master-addr-by-name").arg(name);
                cmd
            }
        }
    }

    /// The node's view from its reply; None when it has none (a sentinel that does not know
    /// the name).
    fn view(&self, reply: &Value) -> Option<Assignment> {
        match self {
            Watched::Cluster => Some(assignment(reply)),
            Watched::Sentinel(_) => {
                let text = |v: &Value| match v {
                    Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                };
                match reply {
                    Value::Array(parts) if parts.len() == 2 => {
                        Some(vec![format!("{}:{}", text(&parts[0])?, text(&parts[1])?)])
                    }
                    _ => None,
                }
            }
        }
    }
}

/// The seed nodes' (or sentinels') views of which primaries serve, with one connection per node
/// kept between polls.
pub struct TopologyWatch {
    nodes: Vec<Seed>,
    /// What each node is asked.
    watched: Watched,
    /// The answering nodes' views when the current wait began or last changed (`None`: no
    /// wait began yet).
    known: Option<HashSet<Assignment>>,
}

/// One seed node: a client for it and the watch's connection.
struct Seed {
    client: Client,
    conn: Option<MultiplexedConnection>,
    /// It answered the last poll (a frozen node accepts connections but never answers).
    answered: bool,
}

impl TopologyWatch {
    /// A watch over these seed nodes (or sentinels).
    pub fn new(seeds: Vec<Client>, watched: Watched) -> TopologyWatch {
        TopologyWatch {
            watched,
            nodes: seeds
                .into_iter()
                .map(|client| Seed {
                    client,
                    conn: None,
                    answered: true,
                })
                .collect(),
            known: None,
        }
    }

    /// Record the views the wait starts from, unless a wait began already (bounded by one
    /// node timeout). Not inside a race: a cancelled recording would leave the watch unarmed.
    pub async fn arm(&mut self) {
        if self.known.is_none() {
            self.known = Some(self.views().await);
        }
    }

    /// Forget the views: the next [`TopologyWatch::changed`] takes them afresh (call when a
    /// flush landed, so each failure compares with the topology it met). Closes the watch's
    /// connections, so a healthy sink holds none.
    pub fn reset(&mut self) {
        if self.known.take().is_some() {
            for seed in &mut self.nodes {
                seed.conn = None;
            }
        }
    }

    /// Whether a wait began since the last [`TopologyWatch::reset`] (a flush is being retried).
    pub fn armed(&self) -> bool {
        self.known.is_some()
    }

    /// While armed, the seeds (by index) that answered the last poll, if some did not: a new
    /// cluster connection waits for every seed it is given, so one given a frozen node would
    /// wait its connect timeout (~5 s) before it could serve. `None`: use every seed.
    pub fn answering(&self) -> Option<Vec<usize>> {
        let answered = || self.nodes.iter().enumerate().filter(|(_, s)| s.answered);
        let n = answered().count();
        (self.armed() && n > 0 && n < self.nodes.len())
            .then(|| answered().map(|(i, _)| i).collect())
    }

    /// Wait until the answering nodes' views differ from those seen when watching began or
    /// when this last returned (the first call after [`TopologyWatch::reset`] records them):
    /// once when the promoted replica reports itself, and again when the others agree with
    /// it. The second matters: an attempt retried in between may have read its slot map from
    /// a node that still named the old primary, and a frozen one would hold it for the whole
    /// response timeout. Never returns if nothing changes: race it with the retry's own delay.
    pub async fn changed(&mut self) {
        loop {
            let views = self.views().await;
            match &mut self.known {
                None => self.known = Some(views),
                Some(known) => {
                    if !views.is_empty() && views != *known {
                        *known = views;
                        return;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every answering node's view, asked concurrently.
    async fn views(&mut self) -> HashSet<Assignment> {
        let some_answered = self.nodes.iter().any(|s| s.answered);
        let watched = &self.watched;
        let asks = self.nodes.iter_mut().map(|seed| async move {
            let Seed {
                client,
                conn,
                answered,
            } = seed;
            let ask = async {
                if conn.is_none() {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(NODE_TIMEOUT))
                        .set_response_timeout(Some(NODE_TIMEOUT));
                    *conn = Some(
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await?,
                    );
                }
                let c = conn.as_mut().expect("connected above");
                watched.command().query_async::<Value>(c).await
            };
            // A node that did not answer last time gets one poll's time while others do: a
            // frozen one would otherwise hold every poll for the whole node timeout.
            let limit = if *answered || !some_answered {
                NODE_TIMEOUT
            } else {
                POLL
            };
            let view = match tokio::time::timeout(limit, ask).await {
                Ok(Ok(reply)) => watched.view(&reply),
                _ => None,
            };
            *answered = view.is_some();
            if view.is_none() {
                *conn = None;
            }
            view
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

/// Run one attempt (`op`) under the watch. A healthy attempt needs none; one that fails or
/// takes [`SLOW_ATTEMPT`] arms it, and from then on a change of the primaries (a failover)
/// abandons the attempt with `changed` rather than waiting for its response timeout.
pub async fn watched<T, E>(
    watch: Option<&mut TopologyWatch>,
    op: impl Future<Output = Result<T, E>>,
    changed: E,
) -> Result<T, E> {
    let Some(watch) = watch else {
        return op.await;
    };
    tokio::pin!(op);
    if !watch.armed() {
        tokio::select! {
            result = &mut op => return result,
            _ = tokio::time::sleep(SLOW_ATTEMPT) => {}
        }
    }
    watch.arm().await;
    tokio::select! {
        result = &mut op => result,
        _ = watch.changed() => Err(changed),
    }
}

/// The primaries of a `CLUSTER SLOTS` reply, sorted.
fn assignment(slots: &Value) -> Assignment {
    let mut out: Assignment = tally_counters::conn::slot_primaries(slots)
        .into_iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: i64, last: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(b"10.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn an_assignment_is_the_sorted_primaries() {
        let a = assignment(&Value::Array(vec![
            range(100, 200, 7001),
            range(0, 99, 7000),
            range(300, 400, 7000),
        ]));
        assert_eq!(a, ["10.0.0.1:7000", "10.0.0.1:7001"]);
        // Resharding between the same primaries: the same assignment.
        let moved = assignment(&Value::Array(vec![
            range(0, 150, 7000),
            range(151, 200, 7001),
        ]));
        assert_eq!(a, moved);
        // A promotion moves a range to another address: another assignment.
        let b = assignment(&Value::Array(vec![
            range(0, 99, 7003),
            range(100, 200, 7001),
        ]));
        assert_ne!(a, b);
        assert!(assignment(&Value::Nil).is_empty());
    }

    #[test]
    fn a_sentinel_view_is_the_primary_it_names() {
        let watched = Watched::Sentinel("mymaster".into());
        let reply = |host: &str, port: &str| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::BulkString(port.as_bytes().to_vec()),
            ])
        };
        assert_eq!(
            watched.view(&reply("10.0.0.1", "6379")),
            Some(vec!["10.0.0.1:6379".to_string()])
        );
        assert_ne!(
            watched.view(&reply("10.0.0.1", "6379")),
            watched.view(&reply("10.0.0.2", "6379"))
        );
        // A sentinel that does not know the name has no view (not an empty one, which would
        // read as a change).
        assert_eq!(watched.view(&Value::Nil), None);
    }
}
