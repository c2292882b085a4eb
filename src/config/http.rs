//! `[http]`: the metrics, health and request endpoint.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::{ensure, invalid};
use super::ConfigError;

/// The largest `max_value`: 2^53 - 1, below which every integer is exact as a double (what a
/// Lua number is, in the hit script's bound check).
const MAX_SAFE: i64 = (1 << 53) - 1;

/// The HTTP endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address for `/metrics`, `/health/*` and `/v1/count`; empty disables the server. Loopback
    /// by default: nothing is exposed unless asked for.
    pub listen: String,
    /// Time a client has to send a request's headers, counted from connecting or from the
    /// previous answer; slow and idle connections are closed after it, so they cannot pile up.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time allowed to answer one request (a `/v1/count` waiting on Redis); past it the answer
    /// is 503. Also the longest a write of an answer may stay blocked on a client that does not
    /// read; then the connection is closed (it would hold a connection slot forever).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Connections served at once. When all are taken, one without a request in flight that
    /// has not made one with the token yet (any request without `token`) is closed to make
    /// room; with none such, one more is refused (plain HTTP: answered 503; with TLS: closed). Bounds the memory and file descriptors clients can take.
    pub max_connections: usize,
    /// Connections served at once from one peer (an IPv4 address, an IPv6 prefix of
    /// `ipv6_peer_prefix` bits), so that one host cannot take all of `max_connections`. None: no
    /// cap of its own (every client may be behind one proxy or sidecar, which is one peer); idle
    /// connections make room for new ones either way.
    pub max_connections_per_peer: Option<usize>,
    /// IPv6 clients sharing this many leading bits of their address count as one peer (a host
    /// is usually given a whole /64).
    pub ipv6_peer_prefix: u8,
    /// A second, plain-HTTP address answering only `/health/live` and `/health/ready`, for
    /// Kubernetes probes: clients of the main port (a flood included) cannot take its
    /// connections. Empty: none.
    pub probe_listen: String,
    /// Bearer token required for `/v1/*` (`Authorization: Bearer <token>`); `/metrics` and
    /// `/health/*` stay open for scrapers and probes. None: no token.
    pub token: Option<String>,
    /// File holding the token (surrounding whitespace ignored), to keep it out of the config.
    pub token_file: Option<std::path::PathBuf>,
    /// Second bearer token, needed (instead of `token`) for what destroys or hands out state:
    /// `reset` on any primitive, quota `release`, pool `fill` and every `/v1/locks` call; it
    /// also passes wherever `token` does. None: every caller may make those calls.
    pub admin_token: Option<String>,
    /// File holding the admin token (surrounding whitespace ignored), to keep it out of the
    /// config.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// With `admin_token` set, a caller with the plain token may not take a counter past this
    /// magnitude by a hit (nor send a larger `value`): a counter pinned near the 64-bit limit
    /// would drop every later stream increment of it. The admin token is not bound.
    pub max_value: i64,
    /// TLS on the port (`[http.tls]`); unset, plain HTTP/1.1.
    pub tls: super::TlsFiles,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:9100".into(),
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_connections: 128,
            max_connections_per_peer: None,
            // A /64 is what one host or one LAN is given.
            ipv6_peer_prefix: 64,
            probe_listen: String::new(),
            token: None,
            token_file: None,
            admin_token: None,
            admin_token_file: None,
            // 2^53 - 1 (JavaScript's MAX_SAFE_INTEGER): integers every JSON reader keeps exact,
            // 1,024× below the 64-bit limit.
            max_value: MAX_SAFE,
            tls: Default::default(),
        }
    }
}

impl HttpConfig {
    /// An address to listen on, positive limits, and one readable token source at most.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_connections()?;
        self.validate_probe()?;
        self.validate_tokens()?;
        ensure(
            (1..=MAX_SAFE).contains(&self.max_value),
            "http.max_value",
            format!(
                "must be 1..={MAX_SAFE} (the hit script compares sums as doubles, exact up to it)"
            ),
        )?;
        self.tls.validate("http.tls")?;
        // The token file is read once, by `Model::compile` (missing or empty: refused there,
        // before anything connects).
        Ok(())
    }

    /// The listener, its timeouts and its connection bounds.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        ensure(
            self.listen.is_empty() || self.listen.parse::<SocketAddr>().is_ok(),
            "http.listen",
            format!("`{}` is not an ip:port address", self.listen),
        )?;
        ensure(
            !self.header_timeout.is_zero(),
            "http.header_timeout",
            "must be positive",
        )?;
        ensure(
            !self.request_timeout.is_zero(),
            "http.request_timeout",
            "must be positive",
        )?;
        ensure(
            self.max_connections > 0,
            "http.max_connections",
            "must be at least 1",
        )?;
        ensure(
            self.max_connections_per_peer != Some(0),
            "http.max_connections_per_peer",
            "must be at least 1",
        )?;
        ensure(
            (1..=128).contains(&self.ipv6_peer_prefix),
            "http.ipv6_peer_prefix",
            "must be 1..=128 (bits of an IPv6 address)",
        )
    }

    /// The probe listener: an address of its own.
    fn validate_probe(&self) -> Result<(), ConfigError> {
        ensure(
            self.probe_listen.is_empty() || self.probe_listen.parse::<SocketAddr>().is_ok(),
            "http.probe_listen",
            format!("`{}` is not an ip:port address", self.probe_listen),
        )?;
        ensure(
            self.probe_listen.is_empty() || self.probe_listen != self.listen,
            "http.probe_listen",
            "must differ from http.listen",
        )
    }

    /// The bearer and admin tokens: each from one source, well-formed, and not the same.
    fn validate_tokens(&self) -> Result<(), ConfigError> {
        ensure(
            !(self.token.is_some() && self.token_file.is_some()),
            "http.token_file",
            "set http.token or http.token_file, not both",
        )?;
        ensure(
            !(self.admin_token.is_some() && self.admin_token_file.is_some()),
            "http.admin_token_file",
            "set http.admin_token or http.admin_token_file, not both",
        )?;
        ensure(
            !self
                .token
                .as_ref()
                .is_some_and(|t| t.trim().is_empty() || t.trim() != t),
            "http.token",
            "must be non-empty, without surrounding whitespace",
        )?;
        ensure(
            !self
                .admin_token
                .as_ref()
                .is_some_and(|t| t.trim().is_empty() || t.trim() != t),
            "http.admin_token",
            "must be non-empty, without surrounding whitespace",
        )?;
        ensure(
            self.admin_token.is_none() || self.admin_token != self.token,
            "http.admin_token",
            "must differ from http.token",
        )
    }

    /// The bearer token for `/v1/*`, from `token` or `token_file`.
    pub fn bearer_token(&self) -> Result<Option<String>, ConfigError> {
        secret(&self.token, &self.token_file, "http.token_file")
    }

    /// The admin token, from `admin_token` or `admin_token_file`.
    pub fn admin_token(&self) -> Result<Option<String>, ConfigError> {
        secret(
            &self.admin_token,
            &self.admin_token_file,
            "http.admin_token_file",
        )
    }
}

/// A secret given inline or as a file (`key` names the file's setting in errors; the secret
/// itself is never in a message).
fn secret(
    inline: &Option<String>,
    file: &Option<std::path::PathBuf>,
    key: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(path) = file else {
        return Ok(inline.clone());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("{}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(invalid(key, format!("{} is empty", path.display())));
    }
    Ok(Some(token.to_string()))
}
