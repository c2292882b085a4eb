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
//! * [`session`]: one stream (one Envoy): its domain, its buckets, the demand it measures;
//! * [`assign`]: the pure share (and the cap the grant script applies);
//! * `tally_counters::request::Ledger`: the report and grant scripts in Redis;
//! * [`session`] again: the grant as Envoy's token bucket (or `DENY_ALL`), `AbandonAction`
//!   for buckets idle for `rlqs.abandon_after`.

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
use tokio::sync::Semaphore;

pub mod assign;
mod session;

use crate::config::{RlqsBucket, RlqsConfig};
use crate::ops::metrics::Metrics;

/// The largest usage report decoded (about 1,000 buckets of a few pairs); a larger message
/// ends the stream with RESOURCE_EXHAUSTED before it is decoded.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Pairs a bucket id may have; a report of a larger id is skipped (`invalid_bucket`).
pub const MAX_BUCKET_KEYS: usize = 16;

/// Bytes of one key or value of a bucket id.
pub const MAX_BUCKET_BYTES: usize = 256;

/// The configuration as the sessions use it.
pub(crate) struct Rules {
    /// The limits, first match wins.
    buckets: Vec<RlqsBucket>,
    tuning: assign::Tuning,
    report_interval: Duration,
    ttl: Duration,
    abandon_after: Duration,
    max_buckets: usize,
}

impl Rules {
    fn new(config: &RlqsConfig) -> Rules {
        Rules {
            buckets: config.buckets.clone(),
            tuning: assign::Tuning {
                headroom: config.headroom,
                floor: config.floor,
            },
            report_interval: config.report_interval,
            ttl: config.assignment_ttl,
            abandon_after: config.abandon_after,
            max_buckets: config.max_buckets_per_stream,
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
    rules: Arc<Rules>,
    ledger: Ledger,
    metrics: Metrics,
    /// One permit per open stream (`rlqs.max_streams`).
    streams: Arc<Semaphore>,
}

impl Rlqs {
    /// A service for `config`'s limits (validated), over `client`'s Redis.
    pub fn new(config: &RlqsConfig, client: Client, metrics: Metrics) -> Rlqs {
        Rlqs {
            rules: Arc::new(Rules::new(config)),
            ledger: Ledger::new(client),
            metrics,
            streams: Arc::new(Semaphore::new(config.max_streams)),
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
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.metrics
                .rls
                .quota
                .skipped
                .with_label_values(&["too_many_streams"])
                .inc();
            return Err(tonic::Status::resource_exhausted(
                "rlqs.max_streams streams are open",
            ));
        };
        let session = session::Session::new(
            self.rules.clone(),
            self.ledger.clone(),
            self.metrics.clone(),
        );
        let answers = session.run(request.into_inner(), permit);
        Ok(tonic::Response::new(answers))
    }
}
