//! Who may hold a stream: at most `rlqs.max_streams` on the replica, of which at most
//! `rlqs.max_streams_per_peer` from one peer and `rlqs.max_streams_per_connection` on one
//! connection, so that one host cannot take every stream another Envoy needs. (A stream that
//! stops reporting is closed by its session, which frees its slot.)

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::edge::peer::Peer;
use crate::ops::metrics::QuotaSkip;

/// The connection a stream comes on, as the port knows it: put in the call's extensions by the
/// server, one per connection.
#[derive(Clone)]
pub struct Connection {
    /// The peer's address.
    peer: IpAddr,
    /// The peer it counts as for `rlqs.max_streams_per_peer`: the RLS port's (its IPv4 address
    /// or IPv6 prefix, `rls.ipv6_peer_prefix`).
    group: Peer,
    /// The client certificate's first subject alternative name, with mutual TLS.
    certificate: Option<Arc<str>>,
    /// Streams open on this connection.
    streams: Arc<AtomicUsize>,
}

impl Connection {
    pub(crate) fn new(peer: IpAddr, group: Peer, certificate: Option<Arc<str>>) -> Connection {
        Connection {
            peer,
            group,
            certificate,
            streams: Arc::default(),
        }
    }

    /// Who makes a call on it, having sent `token` (the name of the bearer token it carried).
    pub fn client(&self, token: Option<&'static str>) -> StreamClient {
        StreamClient {
            peer: self.peer,
            certificate: self.certificate.clone(),
            token,
        }
    }
}

/// Who opened a stream, for the log: the certificate's name with mutual TLS, else the name of
/// the token it sent, else its address (always logged beside). Not a metric label: one
/// certificate or address per Envoy is a label without bound.
#[derive(Clone, Debug)]
pub struct StreamClient {
    /// The peer's address.
    pub peer: IpAddr,
    /// The client certificate's first subject alternative name.
    pub certificate: Option<Arc<str>>,
    /// `token` or `admin_token`: the bearer token the call carried, when one is configured.
    pub token: Option<&'static str>,
}

impl fmt::Display for StreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.certificate, self.token) {
            (Some(name), _) => write!(f, "certificate {name}"),
            (None, Some(token)) => write!(f, "{token} from {}", self.peer),
            (None, None) => write!(f, "{}", self.peer),
        }
    }
}

/// Why a stream was refused: the metric's reason and the setting to raise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefusal {
    /// `rlqs.max_streams` are open on this replica.
    Replica,
    /// `rlqs.max_streams_per_peer` are open from this peer.
    Peer,
    /// `rlqs.max_streams_per_connection` are open on this connection.
    Connection,
}

impl StreamRefusal {
    /// `tally_rlqs_skipped_total{reason}`.
    pub fn reason(self) -> QuotaSkip {
        match self {
            StreamRefusal::Replica => QuotaSkip::TooManyStreams,
            StreamRefusal::Peer => QuotaSkip::TooManyStreamsPerPeer,
            StreamRefusal::Connection => QuotaSkip::TooManyStreamsPerConnection,
        }
    }

    /// What the client is told.
    pub fn message(self) -> &'static str {
        match self {
            StreamRefusal::Replica => "rlqs.max_streams streams are open",
            StreamRefusal::Peer => "rlqs.max_streams_per_peer streams are open from this peer",
            StreamRefusal::Connection => {
                "rlqs.max_streams_per_connection streams are open on this connection"
            }
        }
    }
}

/// The stream slots of the replica.
pub struct StreamSlots {
    total: Arc<Semaphore>,
    per_peer: parking_lot::Mutex<HashMap<Peer, usize>>,
    max_per_peer: usize,
    max_per_connection: usize,
}

/// A stream's slot, given back (on the connection, its peer and the replica) when dropped.
pub struct StreamPermit {
    slots: Arc<StreamSlots>,
    group: Peer,
    connection: Arc<AtomicUsize>,
    _total: OwnedSemaphorePermit,
}

impl StreamSlots {
    pub fn new(max: usize, max_per_peer: usize, max_per_connection: usize) -> Arc<StreamSlots> {
        Arc::new(StreamSlots {
            total: Arc::new(Semaphore::new(max)),
            per_peer: Default::default(),
            max_per_peer,
            max_per_connection,
        })
    }

    /// A slot for a stream on `connection`, or why not.
    pub fn take(self: &Arc<Self>, connection: &Connection) -> Result<StreamPermit, StreamRefusal> {
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| StreamRefusal::Replica)?;
        let on_connection = connection.streams.fetch_add(1, Ordering::Relaxed);
        if on_connection >= self.max_per_connection {
            connection.streams.fetch_sub(1, Ordering::Relaxed);
            return Err(StreamRefusal::Connection);
        }
        let group = connection.group;
        let mut counts = self.per_peer.lock();
        let n = counts.entry(group).or_insert(0);
        if *n >= self.max_per_peer {
            drop(counts);
            connection.streams.fetch_sub(1, Ordering::Relaxed);
            return Err(StreamRefusal::Peer);
        }
        *n += 1;
        Ok(StreamPermit {
            slots: self.clone(),
            group,
            connection: connection.streams.clone(),
            _total: total,
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.connection.fetch_sub(1, Ordering::Relaxed);
        let mut counts = self.slots.per_peer.lock();
        if let Some(n) = counts.get_mut(&self.group) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(ip: &str) -> Connection {
        let ip = ip.parse().unwrap();
        Connection::new(ip, Peer::of(ip, 64), None)
    }

    #[test]
    fn each_cap_holds_and_a_closed_stream_gives_its_slot_back() {
        let slots = StreamSlots::new(4, 3, 2);
        let (a1, a2, b) = (on("10.0.0.1"), on("10.0.0.1"), on("10.0.0.2"));
        let first = slots.take(&a1).expect("1 on a1");
        let _second = slots.take(&a1).expect("2 on a1");
        assert_eq!(slots.take(&a1).err(), Some(StreamRefusal::Connection));
        let _third = slots.take(&a2).expect("3 from 10.0.0.1");
        assert_eq!(slots.take(&a2).err(), Some(StreamRefusal::Peer));
        let _fourth = slots.take(&b).expect("another peer has its own");
        assert_eq!(slots.take(&b).err(), Some(StreamRefusal::Replica));
        drop(first);
        assert!(slots.take(&a1).is_ok(), "a closed stream frees its slot");
    }
}
