//! Envoy's rate limit quota service (RLQS):
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`, served on
//! the RLS port (same TLS, token check and connection caps), for Envoy's
//! `envoy.filters.http.rate_limit_quota` filter. Envoy decides every request locally from the
//! assignment of its bucket and reports its usage periodically on one stream (every 5 s in Envoy
//! 1.40, whatever the bucket's `reporting_interval` says); no request waits for tally.
//!
//! One limit per bucket is shared by every Envoy and every tally replica: each report moves
//! the Envoy's allowed requests into the window's total in Redis and gives it a new grant, cut
//! from what is left by its demand ([`assign`], whose doc states the invariant and the bound
//! on the overshoot). The data flow of one report:
//!
//! * [`usage`]: the report of one bucket parsed and bounded by its grants;
//! * [`session`]: one stream (one Envoy): its domain, its buckets, the demand it measures;
//! * [`assign`]: the pure decision, [`assign::next_grant`] (and the cap the grant script
//!   applies);
//! * `tally_counters::request::Ledger`: the report and grant scripts in Redis;
//! * `render`: the grant as Envoy's token bucket (or `DENY_ALL`), `AbandonAction` for buckets
//!   idle for `rlqs.abandon_after`.
//!
//! Every client is trusted within its grants, and no further: a report counts at most what its
//! stream was granted plus `rlqs.report_slack` ([`usage`]); a stream that stops reporting is
//! closed after `rlqs.assignment_ttl`, and one peer or connection holds a bounded share of the
//! streams ([`slots`]).

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures::stream::BoxStream;
use tally_counters::request::{Client, Ledger};

pub mod assign;
mod render;
mod session;
pub mod slots;
pub mod usage;

use slots::{Connection, StreamSlots};

use crate::config::{RlqsBucket, RlqsConfig};
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;

/// The largest usage report decoded (about 1,000 buckets of a few pairs); a larger message
/// ends the stream with RESOURCE_EXHAUSTED before it is decoded.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Pairs a bucket id may have; a report of a larger id is skipped (`invalid_bucket`).
pub const MAX_BUCKET_KEYS: usize = 16;

/// Bytes of one key or value of a bucket id.
pub const MAX_BUCKET_BYTES: usize = 256;

/// The configuration as the sessions use it.
pub(crate) struct QuotaRules {
    /// The limits, first match wins.
    buckets: Vec<RlqsBucket>,
    tuning: assign::Tuning,
    report_interval: Duration,
    ttl: Duration,
    abandon_after: Duration,
    max_buckets: usize,
    /// `rlqs.report_slack`: what a report may count beyond its stream's grants.
    slack: u64,
}

impl QuotaRules {
    fn new(config: &RlqsConfig) -> QuotaRules {
        QuotaRules {
            buckets: config.buckets.clone(),
            tuning: assign::Tuning {
                headroom: config.headroom,
                floor: config.floor,
            },
            report_interval: config.report_interval,
            ttl: config.assignment_ttl,
            abandon_after: config.abandon_after,
            max_buckets: config.max_buckets_per_stream,
            slack: config.report_slack,
        }
    }

    /// The first limit of `domain` whose every match pair is in `id`.
    fn find(&self, domain: &str, id: &[(String, String)]) -> Option<usize> {
        self.buckets.iter().position(|b| {
            b.domain == domain
                && b.matches
                    .iter()
                    .all(|(k, v)| id.iter().any(|(ik, iv)| ik == k && iv == v))
        })
    }
}

/// The service: its rules, the ledger, the metrics, and the stream slots.
pub struct Rlqs {
    rules: Arc<QuotaRules>,
    ledger: Ledger,
    metrics: Metrics,
    /// One per open stream: `rlqs.max_streams`, per peer and per connection.
    streams: Arc<StreamSlots>,
    /// Limits the lines logged for refused streams.
    refusals: LogLimiter,
    /// Limits the lines logged for reports beyond their grants, across every stream.
    excess: Arc<LogLimiter>,
}

impl Rlqs {
    /// A service for `config`'s limits (validated), over `client`'s Redis.
    pub fn new(config: &RlqsConfig, client: Client, metrics: Metrics) -> Rlqs {
        Rlqs {
            rules: Arc::new(QuotaRules::new(config)),
            ledger: Ledger::new(client),
            metrics,
            streams: StreamSlots::new(
                config.max_streams,
                config.max_streams_per_peer,
                config.max_streams_per_connection,
            ),
            refusals: LogLimiter::new(),
            excess: Arc::new(LogLimiter::new()),
        }
    }

    /// The generated tonic service, its message size bounded.
    pub fn into_service(self) -> RateLimitQuotaServiceServer<Rlqs> {
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream =
        BoxStream<'static, Result<RateLimitQuotaResponse, tonic::Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Self::StreamRateLimitQuotasStream>, tonic::Status> {
        // Put there by the port (with the token the call carried); a call that reaches the
        // service without one is refused rather than counted with no peer.
        let Some((connection, client)) = request
            .extensions()
            .get::<Connection>()
            .cloned()
            .zip(request.extensions().get::<slots::StreamClient>().cloned())
        else {
            return Err(tonic::Status::internal(
                "the call's connection is not known",
            ));
        };
        let permit = match self.streams.take(&connection) {
            Ok(p) => p,
            Err(refusal) => {
                self.metrics.rls.quota.skip(refusal.reason());
                if let Some(suppressed) = self.refusals.allow() {
                    tracing::warn!(%client, peer = %client.peer, suppressed, "rlqs stream refused: {}", refusal.message());
                }
                return Err(tonic::Status::resource_exhausted(refusal.message()));
            }
        };
        let session = session::Session::new(
            self.rules.clone(),
            self.ledger.clone(),
            self.metrics.clone(),
            client,
            self.excess.clone(),
        );
        let answers = session.run(request.into_inner(), permit);
        Ok(tonic::Response::new(answers))
    }
}
