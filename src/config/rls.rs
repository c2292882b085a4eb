//! `[rls]`: Envoy's rate limit service (`ShouldRateLimit` over gRPC) in `tally serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::{ensure, invalid};
use super::ConfigError;

/// The gRPC endpoint Envoy (Istio, Contour, Emissary, kgateway) calls, and its limits file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlsConfig {
    /// Address of the gRPC server (`envoy.service.ratelimit.v3.RateLimitService` and
    /// `grpc.health.v1.Health`, `NOT_SERVING` while Redis is unreachable); empty disables it.
    /// Plain HTTP/2 (h2c) unless `[rls.tls]` is set; with `http.token` set, `ShouldRateLimit` needs it as
    /// `authorization: Bearer …` metadata (Envoy's `grpc_service.initial_metadata`).
    pub listen: String,
    /// The limits in envoyproxy/ratelimit's YAML: one file, or a directory of `*.yaml` files
    /// (one domain each). Required when `listen` is set; read and checked before any port is
    /// bound.
    pub limits_file: Option<PathBuf>,
    /// How often the limits file is checked for changes (SIGHUP reloads at once). A changed
    /// file that is invalid keeps the previous limits (logged, `tally_rls_limits_loads_total`).
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
    /// Connections served at once (Envoy keeps one per worker thread); one more is closed as it
    /// is accepted (logged), so a flood of connections cannot exhaust file descriptors.
    pub max_connections: usize,
    /// An HTTP/2 PING is sent on a connection silent for this long; a peer that does not answer
    /// within `keepalive_timeout` loses the connection (a vanished Envoy frees its slot).
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// How long a PING's answer may take.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// A connection that has not made an admitted call by then (a call with the token when
    /// `http.token` is set, health checks included; any call otherwise) is closed: a peer that connects and
    /// sends nothing, or only calls it may not make, cannot hold a slot.
    #[serde(with = "humantime_serde")]
    pub first_call_timeout: Duration,
    /// Connections served at once from one peer (an IPv4 address, an IPv6 prefix of
    /// `ipv6_peer_prefix` bits; Envoy keeps one per worker thread), so that one host cannot take
    /// all of `max_connections`.
    pub max_connections_per_peer: usize,
    /// IPv6 clients sharing this many leading bits of their address count as one peer (a host
    /// is usually given a whole /64).
    pub ipv6_peer_prefix: u8,
    /// TLS on the port (`[rls.tls]`, ALPN `h2`); unset, plain HTTP/2 (h2c).
    pub tls: super::TlsFiles,
    /// Where a call's keys live in Redis Cluster: `domain` (every key of a domain in one slot:
    /// each call decided in one atomic script) or `subject` (each descriptor's keys in the slot
    /// of its own values, quotas in the domain's: a cluster shares the work; a call whose
    /// descriptors fall in several slots is decided slot by slot, see guide 09). Changing it
    /// starts every count afresh (new keys).
    pub spread: Spread,
}

/// `rls.spread`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Spread {
    /// One hash tag per domain.
    #[default]
    Domain,
    /// One hash tag per descriptor subject (domain and values).
    Subject,
}

impl Default for RlsConfig {
    fn default() -> Self {
        RlsConfig {
            listen: String::new(),
            limits_file: None,
            reload_interval: Duration::from_secs(1),
            max_connections: 1024,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            first_call_timeout: Duration::from_secs(10),
            max_connections_per_peer: 128,
            // A /64 is what one host or one LAN is given.
            ipv6_peer_prefix: 64,
            tls: Default::default(),
            spread: Spread::Domain,
        }
    }
}

impl RlsConfig {
    /// An address, a limits file that loads, a positive reload interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.is_empty() {
            return Ok(());
        }
        ensure(
            self.listen.parse::<SocketAddr>().is_ok(),
            "rls.listen",
            format!("`{}` is not an ip:port address", self.listen),
        )?;
        ensure(
            !self.reload_interval.is_zero(),
            "rls.reload_interval",
            "must be positive",
        )?;
        ensure(
            self.max_connections >= 1,
            "rls.max_connections",
            "must be at least 1",
        )?;
        ensure(
            self.max_connections_per_peer >= 1,
            "rls.max_connections_per_peer",
            "must be at least 1",
        )?;
        ensure(
            (1..=128).contains(&self.ipv6_peer_prefix),
            "rls.ipv6_peer_prefix",
            "must be 1..=128 (bits of an IPv6 address)",
        )?;
        for (name, d) in [
            ("rls.keepalive_interval", self.keepalive_interval),
            ("rls.keepalive_timeout", self.keepalive_timeout),
            ("rls.first_call_timeout", self.first_call_timeout),
        ] {
            ensure(!d.is_zero(), name, "must be positive")?;
        }
        self.tls.validate("rls.tls")?;
        if self.limits_file.is_none() {
            return Err(invalid(
                "rls.limits_file",
                "required when rls.listen is set",
            ));
        }
        // The file itself is read once, by `Model::compile` (after every section is valid).
        Ok(())
    }
}
