//! Noticing a cluster client that stopped serving requests, so a request does not wait for its
//! response timeout on a client that will never answer it.
//!
//! redis-rs 1.8's cluster client runs every request in one task, and while that task refreshes
//! its slot map (after a MOVED, or a connection lost to a killed primary) it polls only the
//! refresh, not the requests in flight. The refresh needs the client's connection table for
//! writing; a request in flight that had queued for reading that table (tokio's `RwLock` is
//! fair: readers queue behind a waiting writer) is granted its read when the previous holder
//! lets go, but is not polled again to use and release it. The refresh then waits for that read
//! and the request waits for the refresh: the client answers nothing more, ever (the same
//! deadlock as redis-rs/redis-rs#2418, there with its reconnect futures). Measured with a primary
//! killed under a steady flush: "beginning slot refresh" logged, then nothing for 3-4 s, until
//! tally dropped the client when the promotion was seen, or until the flush's 5 s response
//! timeout when the client had stopped after the promotion, which is why a failover took
//! 6.6-11.4 s end to end.
//!
//! So a cluster request that runs for [`CHECK_AFTER`] asks the same client for a `PING` (to one
//! node, whichever it picks). A client that answers neither it nor any other request within
//! [`CHECK_WITHIN`] is stuck, and the request fails at once with [`stuck_error`]: the caller
//! drops the connection and makes a new one (a new client, a new slot map) instead of waiting.
//! A client that is only busy (a large flush: the `PING` queues behind a chunk per shard on its
//! node) still completes requests in that time, so a slow request is not failed by this; a
//! `PING` answered with an error is an answer too (the client is alive, the node is not).
//!
//! A `WAIT` holds its node connection until the replicas answer or its timeout passes: the
//! requests queued behind it on that node, and a `PING` that lands there, wait for it. While a
//! `WAIT` may be holding a connection ([`Cluster::blocks_for`]), a check that gets no answer
//! is not taken for a stuck client; the next check after it is.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, RedisResult};

/// A cluster request running this long has the client checked (a healthy one takes
/// milliseconds), and checked again this often while it runs.
const CHECK_AFTER: Duration = Duration::from_millis(100);
/// How long the client has to answer something once checked.
const CHECK_WITHIN: Duration = Duration::from_millis(200);

/// The error of a request abandoned because its client stopped answering (an I/O timeout: the
/// request may have been sent, and the connection must be made again).
fn stuck_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the redis cluster client stopped answering (its slot refresh is stuck); reconnecting",
    ))
}

/// A cluster client, and how many of its requests were answered so far (shared by its clones).
/// redis-rs' cluster client can stop for good in a slot refresh: its requests then fail within
/// ~0.3 s, rather than at their response timeout, and the caller reconnects.
#[derive(Clone)]
pub struct Cluster {
    /// The client (cheap to clone: a handle on its task).
    pub(super) client: ClusterConnection,
    /// Requests answered (with a reply or an error) through any clone: progress while a check
    /// waits means the client is busy, not stuck.
    answered: Arc<AtomicU64>,
    /// When the client was made: `blocked_until` counts from it.
    made: std::time::Instant,
    /// Until when (ms after `made`) a `WAIT` sent through any clone may hold a node connection.
    blocked_until: Arc<AtomicU64>,
}

impl Cluster {
    pub(super) fn new(client: ClusterConnection) -> Cluster {
        Cluster {
            client,
            answered: Arc::default(),
            made: std::time::Instant::now(),
            blocked_until: Arc::default(),
        }
    }

    /// A `WAIT` of `timeout` is about to be sent: until it has had that time, requests queued
    /// behind it are not a sign of a stuck client.
    pub(super) fn blocks_for(&self, timeout: Duration) {
        let until = (self.made.elapsed() + timeout + CHECK_WITHIN).as_millis() as u64;
        self.blocked_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether a `WAIT` may still be holding a node connection.
    fn may_be_blocked(&self) -> bool {
        (self.made.elapsed().as_millis() as u64) < self.blocked_until.load(Ordering::Relaxed)
    }

    /// Run `request` (sent through this client), failing it with [`stuck_error`] as soon as
    /// the client stops answering.
    pub(super) async fn unless_stuck<T>(
        &self,
        request: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        tokio::pin!(request);
        let mut probe = self.client.clone();
        loop {
            tokio::select! {
                result = &mut request => return self.answer(result),
                _ = tokio::time::sleep(CHECK_AFTER) => {}
            }
            let before = self.answered.load(Ordering::Relaxed);
            let ping = tokio::time::timeout(
                CHECK_WITHIN,
                probe.route_command(
                    redis::cmd("PING"),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                ),
            );
            tokio::select! {
                result = &mut request => return self.answer(result),
                answered = ping => {
                    if answered.is_err()
                        && self.answered.load(Ordering::Relaxed) == before
                        && !self.may_be_blocked()
                    {
                        return Err(stuck_error());
                    }
                }
            }
        }
    }

    fn answer<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        self.answered.fetch_add(1, Ordering::Relaxed);
        result
    }
}
