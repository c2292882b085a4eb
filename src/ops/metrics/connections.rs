//! The connections of the request-path ports (HTTP, its probe port, RLS): how many each holds,
//! and those refused or closed to make room, so an operator sees a port filling up and who
//! is being turned away.

use prometheus::{IntCounterVec, IntGaugeVec, Registry};

super::labels::labels!(
    /// Why a connection was refused as it was accepted
    /// (`tally_port_connections_refused_total{reason}`).
    Refusal {
        /// Every slot of `max_connections` held by a connection that made a call.
        Full => "full",
        /// Its peer (an IPv4 address, an IPv6 prefix) held `max_connections_per_peer` already.
        Peer => "peer",
    }
);

/// Connection counts per port (`port`: `http`, `probe`, `rls`).
#[derive(Clone)]
pub struct ConnectionMetrics {
    /// Connections a port holds, each a slot of its `max_connections`.
    pub open: IntGaugeVec,
    /// Connections refused as they were accepted, by port and [`Refusal`].
    pub refused: IntCounterVec,
    /// Connections that had not made a call, closed to make room for a new one on a full port.
    pub evicted: IntCounterVec,
}

impl ConnectionMetrics {
    pub(super) fn new(registry: &Registry) -> ConnectionMetrics {
        ConnectionMetrics {
            open: super::gauge_vec(
                registry,
                "tally_port_connections",
                "Connections a request-path port holds (each takes a slot of its max_connections), by port.",
                &["port"],
            ),
            refused: super::counter_vec(
                registry,
                "tally_port_connections_refused_total",
                "Connections refused as they were accepted, by port and reason (full: every slot held by a connection that made a call; peer: its peer's max_connections_per_peer reached).",
                &["port", "reason"],
            ),
            evicted: super::counter_vec(
                registry,
                "tally_port_connections_evicted_total",
                "Connections that had made no call yet, closed to make room for a new one on a full port, by port.",
                &["port"],
            ),
        }
    }

    /// Give `port` its series at zero, so a dashboard shows the port before the first refusal.
    pub fn register_port(&self, port: &str) {
        self.open.with_label_values(&[port]);
        self.evicted.with_label_values(&[port]);
        for r in Refusal::ALL {
            self.refused.with_label_values(&[port, r.label()]);
        }
    }
}
