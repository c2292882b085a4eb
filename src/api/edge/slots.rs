//! The slots of a port, the same for HTTP and gRPC: at most `max` connections at once, at most
//! `max_per_peer` of them from one [`Peer`] (an IPv4 address or an IPv6 prefix). When every slot
//! is taken (or the peer's share), a connection that has not made an admitted call yet is closed
//! to make room (the oldest of the peer holding the most such): peers that connect and send
//! nothing (or only calls they may not make) never keep a real client out, and a connection that
//! is serving calls is never closed for a newcomer.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{IntCounter, IntGauge};
use tokio_util::sync::CancellationToken;

use super::peer::Peer;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::{ConnectionMetrics, Refusal};

/// How many connections a port holds; from `<port>.max_connections`,
/// `<port>.max_connections_per_peer` and `<port>.ipv6_peer_prefix`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotLimits {
    /// Connections at once.
    pub max: usize,
    /// Connections at once from one peer.
    pub max_per_peer: usize,
    /// IPv6 addresses sharing this many leading bits are one peer.
    pub ipv6_prefix: u8,
}

/// The slots of one port (shared by its accept loop and its connections' slots).
pub(crate) struct Slots {
    /// `http`, `probe` or `rls`: the logs' and the metrics' name of the port.
    port: &'static str,
    limits: SlotLimits,
    state: parking_lot::Mutex<SlotsState>,
    /// The port's series of [`ConnectionMetrics`].
    open: IntGauge,
    refused_full: IntCounter,
    refused_peer: IntCounter,
    evicted: IntCounter,
    /// One line per 10 s at most for refusals, and one for evictions: a flood repeats them.
    refused_log: LogLimiter,
    evicted_log: LogLimiter,
}

/// The connections held, by age.
#[derive(Default)]
struct SlotsState {
    /// Every connection holding a slot, by id; ids grow, so the first is the oldest.
    held: BTreeMap<u64, Held>,
    /// Slots held per peer (absent: none).
    peers: HashMap<Peer, usize>,
    next_id: u64,
}

/// What the port knows of a connection holding a slot.
struct Held {
    peer: Peer,
    /// Set by the connection once it made an admitted call: from then on it is not evicted.
    admitted: Arc<AtomicBool>,
    /// Cancelled to close the connection to make room.
    evict: CancellationToken,
}

/// A connection's slot, given back when dropped (or when the connection is evicted).
pub(crate) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// Who holds it.
    peer: Peer,
    admitted: Arc<AtomicBool>,
    evict: CancellationToken,
}

impl Slots {
    pub(crate) fn new(
        port: &'static str,
        limits: SlotLimits,
        metrics: &ConnectionMetrics,
    ) -> Arc<Slots> {
        metrics.register_port(port);
        Arc::new(Slots {
            port,
            limits,
            state: Default::default(),
            open: metrics.open.with_label_values(&[port]),
            refused_full: metrics
                .refused
                .with_label_values(&[port, Refusal::Full.label()]),
            refused_peer: metrics
                .refused
                .with_label_values(&[port, Refusal::Peer.label()]),
            evicted: metrics.evicted.with_label_values(&[port]),
            refused_log: LogLimiter::new(),
            evicted_log: LogLimiter::new(),
        })
    }

    /// A slot for a connection from `ip` just accepted, making room when the port is full or its
    /// peer holds its share; the refusal (logged, rate-limited, counted) when no connection there
    /// is without an admitted call: the caller then closes it.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let peer = Peer::of(ip, self.limits.ipv6_prefix);
        let mut state = self.state.lock();
        // Room is made among the peer's own connections when it holds its share, else among
        // all when the port is full.
        let full = if state.peers.get(&peer).copied().unwrap_or(0) >= self.limits.max_per_peer {
            Some((Refusal::Peer, Some(peer)))
        } else if state.held.len() >= self.limits.max {
            Some((Refusal::Full, None))
        } else {
            None
        };
        if let Some((why, among)) = full {
            let victim = state.victim(among);
            let Some(held) = victim.and_then(|id| state.release(id)) else {
                drop(state);
                return Err(self.refused(why, peer));
            };
            held.evict.cancel();
            self.open.dec();
            self.evicted.inc();
            if let Some(suppressed) = self.evicted_log.allow() {
                let setting = setting(why);
                tracing::warn!(port = self.port, peer = %held.peer, suppressed,
                    "{setting} reached: a connection that made no call yet closed to make room");
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let (admitted, evict) = (Arc::new(AtomicBool::new(false)), CancellationToken::new());
        state.held.insert(
            id,
            Held {
                peer,
                admitted: admitted.clone(),
                evict: evict.clone(),
            },
        );
        *state.peers.entry(peer).or_insert(0) += 1;
        self.open.inc();
        Ok(Slot {
            slots: self.clone(),
            id,
            peer,
            admitted,
            evict,
        })
    }

    /// The port's name (`http`, `probe`, `rls`), for its logs.
    pub(crate) fn port(&self) -> &'static str {
        self.port
    }

    fn refused(&self, why: Refusal, peer: Peer) -> Refusal {
        let (counter, max) = match why {
            Refusal::Full => (&self.refused_full, self.limits.max),
            Refusal::Peer => (&self.refused_peer, self.limits.max_per_peer),
        };
        counter.inc();
        let setting = setting(why);
        if let Some(suppressed) = self.refused_log.allow() {
            tracing::warn!(port = self.port, %peer, max, suppressed, "connection refused: {setting} reached");
        }
        why
    }
}

/// The setting whose limit `why` is.
fn setting(why: Refusal) -> &'static str {
    match why {
        Refusal::Full => "max_connections",
        Refusal::Peer => "max_connections_per_peer",
    }
}

impl SlotsState {
    /// The connection to close to make room: one without an admitted call, of peer `among` or
    /// else of the peer holding the most such (a flood that reconnects as fast as it is closed
    /// then closes its own, not a real client's connection in the middle of its handshake); the
    /// oldest of them, which had the longest to make its call.
    fn victim(&self, among: Option<Peer>) -> Option<u64> {
        let mut idle = self
            .held
            .iter()
            .filter(|(_, held)| !held.admitted.load(Ordering::Relaxed));
        if let Some(peer) = among {
            return idle.find(|(_, held)| held.peer == peer).map(|(id, _)| *id);
        }
        // Per peer: how many, and the oldest.
        let mut peers: HashMap<Peer, (usize, u64)> = HashMap::new();
        for (id, held) in idle {
            peers.entry(held.peer).or_insert((0, *id)).0 += 1;
        }
        peers
            .into_values()
            .max_by_key(|&(n, oldest)| (n, std::cmp::Reverse(oldest)))
            .map(|(_, oldest)| oldest)
    }

    /// Forget connection `id` (None: already gone) and give its peer's place back.
    fn release(&mut self, id: u64) -> Option<Held> {
        let held = self.held.remove(&id)?;
        if let Some(n) = self.peers.get_mut(&held.peer) {
            *n -= 1;
            if *n == 0 {
                self.peers.remove(&held.peer);
            }
        }
        Some(held)
    }
}

impl Slot {
    /// The peer the connection counts as (its IPv4 address or IPv6 prefix).
    pub(crate) fn peer(&self) -> Peer {
        self.peer
    }

    /// The flag the connection sets once it made an admitted call (it is then never evicted).
    pub(crate) fn admitted(&self) -> Arc<AtomicBool> {
        self.admitted.clone()
    }

    /// Cancelled when the connection is to be closed to make room: its task closes it.
    pub(crate) fn evicted(&self) -> CancellationToken {
        self.evict.clone()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // An evicted connection's slot was given back when it was evicted.
        if self.slots.state.lock().release(self.id).is_some() {
            self.slots.open.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize, max_per_peer: usize) -> Arc<Slots> {
        let metrics = crate::ops::metrics::Metrics::new(&[]);
        let limits = SlotLimits {
            max,
            max_per_peer,
            ipv6_prefix: 64,
        };
        Slots::new("test", limits, &metrics.request.connections)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_gives_it_back() {
        let slots = slots(10, 2);
        let first = slots.take(ip("10.0.0.1")).expect("1 of 2");
        let second = slots.take(ip("10.0.0.1")).expect("2 of 2");
        first.admitted().store(true, Ordering::Relaxed);
        let third = slots
            .take(ip("10.0.0.1"))
            .expect("in place of its idle one");
        assert!(second.evicted().is_cancelled() && !first.evicted().is_cancelled());
        third.admitted().store(true, Ordering::Relaxed);
        assert_eq!(slots.take(ip("10.0.0.1")).err(), Some(Refusal::Peer));
        assert!(
            slots.take(ip("10.0.0.2")).is_ok(),
            "another peer has its own"
        );
        drop(first);
        assert!(
            slots.take(ip("10.0.0.1")).is_ok(),
            "a closed connection frees its place"
        );
        assert_eq!(slots.refused_peer.get(), 1);
    }

    #[test]
    fn one_ipv6_prefix_is_one_peer() {
        let slots = slots(10, 1);
        let held = slots.take(ip("2001:db8::1")).unwrap();
        held.admitted().store(true, Ordering::Relaxed);
        assert_eq!(
            slots.take(ip("2001:db8::ffff")).err(),
            Some(Refusal::Peer),
            "the same /64"
        );
        assert!(slots.take(ip("2001:db8:0:1::1")).is_ok(), "the next /64");
    }

    #[test]
    fn a_full_port_closes_its_oldest_connection_without_a_call() {
        let slots = slots(3, 3);
        let serving = slots.take(ip("10.0.0.1")).unwrap();
        serving.admitted().store(true, Ordering::Relaxed);
        let idle = slots.take(ip("10.0.0.2")).unwrap();
        let younger = slots.take(ip("10.0.0.2")).unwrap();
        let newcomer = slots.take(ip("10.0.0.3")).expect("room made");
        assert!(idle.evicted().is_cancelled(), "the oldest idle one goes");
        assert!(!serving.evicted().is_cancelled() && !younger.evicted().is_cancelled());
        assert_eq!((slots.open.get(), slots.evicted.get()), (3, 1));
        // The evicted connection's task ends later: its slot was given back already.
        drop(idle);
        assert_eq!(slots.open.get(), 3);
        younger.admitted().store(true, Ordering::Relaxed);
        newcomer.admitted().store(true, Ordering::Relaxed);
        assert_eq!(
            slots.take(ip("10.0.0.4")).err(),
            Some(Refusal::Full),
            "every slot serving calls"
        );
        drop(serving);
        assert!(slots.take(ip("10.0.0.4")).is_ok(), "a slot given back");
    }

    #[test]
    fn the_peer_holding_the_most_idle_slots_makes_room() {
        let slots = slots(3, 3);
        let client = slots.take(ip("10.0.0.1")).unwrap();
        let flood: Vec<_> = (0..2)
            .map(|_| slots.take(ip("10.0.0.9")).unwrap())
            .collect();
        let _again = slots.take(ip("10.0.0.9")).expect("room made");
        assert!(flood[0].evicted().is_cancelled(), "the flood's oldest");
        assert!(
            !client.evicted().is_cancelled(),
            "not the older real client"
        );
    }
}
