//! `http.probe_listen`: `/health/live` and `/health/ready` alone, plain HTTP, on an address and
//! connections of their own. On the main port a probe competes with every client for
//! `http.max_connections`; here a flood of that port (or a full one) cannot make a liveness
//! probe fail and restart a healthy process.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{listener, AppState};
use crate::api::edge::listener::{self as edge_listener, PortError};
use crate::api::edge::slots::{SlotLimits, Slots};
use crate::config::{HttpConfig, Tokens};

/// Connections served at once: a kubelet opens one per probe (startup, liveness, readiness),
/// closed after the answer; the rest is margin for other probers.
const MAX_CONNECTIONS: usize = 16;
/// Connections at once from one peer: the kubelet of the node, a load balancer's checks.
const MAX_PER_PEER: usize = 8;

/// The probe port, bound.
pub(super) struct Probe {
    listener: TcpListener,
}

/// Bind `http.probe_listen` (None when empty): a taken address fails start-up, as the main
/// port's does.
pub(super) async fn bind(config: &HttpConfig) -> Result<Option<Probe>, PortError> {
    const KEY: &str = "http.probe_listen";
    if config.probe_listen.is_empty() {
        return Ok(None);
    }
    let addr = edge_listener::address(KEY, &config.probe_listen)?;
    let (listener, local) = edge_listener::bind(KEY, &addr.to_string()).await?;
    tracing::info!(addr = %local, "serving /health/live and /health/ready for probes");
    Ok(Some(Probe { listener }))
}

impl Probe {
    /// The server of the health endpoints, until `shutdown`, with the main port's timeouts.
    pub(super) fn serve(
        self,
        config: &HttpConfig,
        state: AppState,
        tokens: Arc<Tokens>,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let slots = Slots::new(
            "probe",
            SlotLimits {
                max: MAX_CONNECTIONS,
                max_per_peer: MAX_PER_PEER,
                ipv6_prefix: config.ipv6_peer_prefix,
            },
            &state.metrics.request.connections,
        );
        let limits = listener::ConnLimits {
            header_timeout: config.header_timeout,
            request_timeout: config.request_timeout,
            tls: None,
            tokens,
        };
        let app = super::health_routes().with_state(state);
        listener::run(self.listener, app, slots, limits, shutdown)
    }
}
