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
    /// Plain HTTP/2 (h2c), no TLS; with `http.token` set, `ShouldRateLimit` needs it as
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
}

impl Default for RlsConfig {
    fn default() -> Self {
        RlsConfig {
            listen: String::new(),
            limits_file: None,
            reload_interval: Duration::from_secs(1),
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
        let Some(path) = &self.limits_file else {
            return Err(invalid(
                "rls.limits_file",
                "required when rls.listen is set",
            ));
        };
        crate::rls::Limits::load(path).map_err(|e| invalid("rls.limits_file", e.to_string()))?;
        Ok(())
    }
}
