//! Envoy's rate limit service: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//! over gRPC, so that Envoy, Istio, Contour, Emissary and kgateway can use tally as their rate
//! limit service (RLS), with the limits written as for envoyproxy/ratelimit.
//!
//! * [`crate::config::limits`]: the limits file as written (envoyproxy/ratelimit's YAML plus
//!   tally's keys), compiled into one descriptor tree per domain, and the lookup (its rules);
//! * one call, in three steps ([`answer`]): [`call`] parses the request into domain types,
//!   [`decide`] matches the limits and turns one atomic limiter call into the answer (pure but
//!   for that call), [`render`] writes the protobuf response (or the gRPC status of an
//!   [`RlsError`]);
//! * this module: the gRPC server (with `grpc.health.v1.Health`, `NOT_SERVING` while Redis is
//!   unreachable: [`HealthStatus`]) and the reload of the file (on change or SIGHUP; an invalid
//!   file keeps the previous limits).
//!
//! Counts live in the request path's rate-limit keys (`<prefix>limit:<policy>:<subject>`), all
//! of one domain under one hash tag, so one call is one script on one slot in a cluster too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures::future::BoxFuture;
use parking_lot::RwLock;
use tally_counters::request::Client;
use tokio_util::sync::CancellationToken;

mod answer;
pub mod call;
mod client_cert;
pub mod decide;
mod error;
mod metadata;
mod render;
mod reserve;
mod server;
mod sizes;
mod spread;

pub use error::{RlsError, RlsErrorKind};
pub use sizes::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_BYTES};

pub use crate::config::limits::{Limits, LimitsError, Rule, Unit};

use crate::api::edge::listener::{self, PortError};
use crate::api::edge::slots::{SlotLimits, Slots};
use crate::api::edge::tls::Tls;
use crate::api::edge::watch::{hangup, WatchError};
use crate::config::{RlsConfig, Spread, Tokens};
use crate::ops::metrics::Metrics;

/// The largest `ShouldRateLimit` message decoded: [`MAX_DESCRIPTORS`] descriptors of
/// [`MAX_ENTRIES`] entries of [`MAX_VALUE_BYTES`] fit in about 2 MiB; real
/// calls are far below. Beyond it the call fails with RESOURCE_EXHAUSTED.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The service: the current limits (swapped whole on reload), the connection, the metrics.
pub struct Rls {
    /// Replaced by a reload; a call holds its snapshot to the end, so it never sees two files.
    limits: RwLock<Arc<Limits>>,
    client: Client,
    metrics: Metrics,
    /// `rls.spread`.
    spread: Spread,
}

impl Rls {
    /// A service answering from `limits`.
    pub fn new(limits: Arc<Limits>, client: Client, metrics: Metrics, spread: Spread) -> Rls {
        publish_limits(&metrics, &limits);
        Rls {
            limits: RwLock::new(limits),
            client,
            metrics,
            spread,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits.read().clone()
    }

    /// Read `path` again: valid, it replaces the limits; invalid, the previous ones stay (the
    /// error is returned, logged and counted).
    pub fn reload(&self, path: &Path) -> Result<(), LimitsError> {
        let m = &self.metrics.rls.reloads;
        match Limits::load(path) {
            Ok(limits) => {
                publish_limits(&self.metrics, &limits);
                *self.limits.write() = Arc::new(limits);
                m.with_label_values(&["ok"]).inc();
                tracing::info!(file = %path.display(), "rls limits loaded");
                Ok(())
            }
            Err(e) => {
                m.with_label_values(&["invalid"]).inc();
                tracing::warn!(error = %e, "rls limits file refused; the previous limits stay");
                Err(e)
            }
        }
    }
}

/// Set the gauges of the limits in force to `limits` (the previous file's series go).
fn publish_limits(metrics: &Metrics, limits: &Limits) {
    let (limit, window) = (&metrics.rls.limit, &metrics.rls.limit_window);
    limit.reset();
    window.reset();
    for (domain, rule) in limits.rules().into_iter().filter(|(_, r)| !r.unlimited) {
        let labels = [domain, rule.label.as_str()];
        let units = if rule.blocked { 0 } else { rule.policy.limit };
        limit.with_label_values(&labels).set(units as i64);
        let seconds = rule.policy.window.as_secs() as i64;
        window.with_label_values(&labels).set(seconds);
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let limits = self.limits();
        let req = request.into_inner();
        answer::should_rate_limit(&limits, &self.client, &self.metrics, self.spread, &req)
            .await
            .map(tonic::Response::new)
    }
}

/// What `grpc.health.v1.Health` answers, for the server (`""`) and the rate limit service
/// alike: `SERVING` while Redis answers, `NOT_SERVING` while it does not (set by `tally
/// serve`'s Redis probe), so a gRPC health check takes the instance out before calls fail.
#[derive(Clone)]
pub struct HealthStatus(tonic_health::server::HealthReporter);

impl HealthStatus {
    /// Report `serving` for both names.
    pub async fn set(&self, serving: bool) {
        use tonic::server::NamedService as _;
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for name in ["", RateLimitServiceServer::<Rls>::NAME] {
            self.0.set_service_status(name, status).await;
        }
    }
}

/// The running service: its address and the tasks to supervise.
pub struct Serving {
    /// The bound address (`rls.listen`, with the port chosen when it was 0).
    pub local: SocketAddr,
    /// The service (for tests and benchmarks that call it in-process).
    pub rls: Arc<Rls>,
    /// Its gRPC health status (`SERVING` until told otherwise).
    pub health: HealthStatus,
    /// The gRPC server (and the reloader of its TLS files), until the shutdown token.
    pub server: BoxFuture<'static, Result<(), WatchError>>,
    /// The reloader of the limits file, until the shutdown token.
    pub reloader: BoxFuture<'static, Result<(), WatchError>>,
}

/// The limits file: where it is (`rls.limits_file`, which validation requires with
/// `rls.listen`) and the limits it held when the configuration loaded it.
pub struct LimitsFile {
    pub path: PathBuf,
    pub limits: Arc<Limits>,
}

/// Bind `config.listen` and answer from the limits `file` held at start until a reload
/// replaces them.
pub async fn serve(
    config: &RlsConfig,
    file: LimitsFile,
    rlqs: Option<crate::api::rlqs::Rlqs>,
    tokens: Tokens,
    client: Client,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<Serving, PortError> {
    let rls = Arc::new(Rls::new(
        file.limits,
        client,
        metrics.clone(),
        config.spread,
    ));
    metrics.rls.reloads.with_label_values(&["ok"]).inc();
    // The certificate files are read before the port is bound: a bad file fails start-up.
    let tls = Tls::load("rls", &config.tls, &[b"h2"], &metrics.request)?;
    let (listener, local) = listener::bind("rls.listen", &config.listen).await?;
    if tokens.token.is_none() && !local.ip().is_loopback() {
        tracing::warn!(%local, "serving envoy's rate limit service beyond loopback without http.token");
    }
    let (reporter, health) = tonic_health::server::health_reporter();
    let health_status = HealthStatus(reporter);
    health_status.set(true).await;
    let routes = server::Routes::new(rls.clone(), rlqs, health, tokens);
    let slots = Slots::new(
        "rls",
        SlotLimits {
            max: config.max_connections,
            max_per_peer: config.max_connections_per_peer,
            ipv6_prefix: config.ipv6_peer_prefix,
        },
        &metrics.request.connections,
    );
    let conn_limits = server::GrpcLimits {
        keepalive_interval: config.keepalive_interval,
        keepalive_timeout: config.keepalive_timeout,
        first_call_timeout: config.first_call_timeout,
        tls: tls.clone(),
    };
    let server = server::run(listener, routes, slots, conn_limits, shutdown.clone());
    let tls_watch = tls.map(|tls| tls.watch(shutdown.clone()));
    let server = async move {
        let Some(watch) = tls_watch else {
            server.await;
            return Ok(());
        };
        tokio::join!(server, watch).1
    };
    let reloader = watch(rls.clone(), file.path, config.reload_interval, shutdown);
    Ok(Serving {
        local,
        rls,
        health: health_status,
        server: Box::pin(server),
        reloader: Box::pin(reloader),
    })
}

/// Reload `path` when its content changes (checked every `every`) or on SIGHUP, until `stop`.
async fn watch(
    rls: Arc<Rls>,
    path: PathBuf,
    every: Duration,
    stop: CancellationToken,
) -> Result<(), WatchError> {
    let mut hup = hangup("rls.limits_file")?;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = content(&path);
    // A new content seen once: applied when the next look finds it unchanged, so a file being
    // rewritten in place is never applied half-written (a truncated file can parse, with fewer
    // limits).
    let mut changed: Option<Vec<u8>> = None;
    loop {
        let forced = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => false,
            _ = hup.recv() => true,
        };
        let now = content(&path);
        if !forced && now == seen {
            changed = None;
            continue;
        }
        let settled = if forced {
            // SIGHUP: look again shortly after rather than wait for the next tick.
            tokio::time::sleep(SETTLE).await;
            content(&path) == now
        } else {
            changed.as_ref() == Some(&now)
        };
        if settled {
            seen = now;
            changed = None;
            let _ = rls.reload(&path);
        } else {
            changed = Some(now);
        }
    }
}

/// How long after SIGHUP the limits file is read again to see that it holds still.
const SETTLE: Duration = Duration::from_millis(100);

/// The bytes of the file, or of every file of the directory with its name (unreadable: empty;
/// the reload then says why).
fn content(path: &Path) -> Vec<u8> {
    if !path.is_dir() {
        return std::fs::read(path).unwrap_or_default();
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(path)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        out.extend_from_slice(n.as_os_str().as_encoded_bytes());
        out.push(0);
        out.extend(std::fs::read(&n).unwrap_or_default());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, Model};

    /// [`super::serve`] takes the limits file as given: the configuration never asks for the
    /// service without one, and the model holds the limits whenever it does.
    #[test]
    fn rls_listen_needs_a_limits_file_before_anything_is_served() {
        let config = |rls: &str| -> Config {
            toml::from_str(&format!(
                "[kafka]\nbrokers = \"127.0.0.1:9\"\ntopic = \"t\"\ngroup_id = \"g\"\n\
                 [[counters]]\nname = \"c\"\ndimensions = [\"a\"]\nkey = \"c:{{a}}:{{yyyyMMddHH}}\"\n\
                 window = \"1h\"\n[rls]\n{rls}"
            ))
            .unwrap()
        };
        let e = Model::compile(config("listen = \"127.0.0.1:0\"\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("`rls.limits_file`: required when rls.listen is set"),
            "{e}"
        );
        let model = Model::compile(config("")).unwrap();
        assert!(model.rls_limits.is_none());
    }
}
