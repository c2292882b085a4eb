//! Render: what a bucket's report is answered with, as Envoy's `BucketAction`s.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use super::assign;

/// A bucket's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BucketAssignment {
    /// So many requests until the next report (0: `DENY_ALL`), for `ttl`.
    Grant { grant: u64, ttl: Duration },
    /// The bucket was idle for `rlqs.abandon_after`: Envoy drops it.
    Abandon,
}

impl BucketAssignment {
    /// The actions for `bucket_id`.
    ///
    /// A grant is a token bucket that admits at most the grant within `ttl`
    /// ([`assign::BucketShape`]); `DENY_ALL` for none. It goes after a `DENY_ALL` of the same bucket
    /// in the same answer. Envoy applies an answer's actions in order and publishes the result
    /// once, so no request sees the `DENY_ALL`; but Envoy starts a token bucket that replaces
    /// another with the other's remaining share (1.40), which would turn a fresh grant after a
    /// spent one into an empty bucket. After a blanket rule, it starts full.
    pub(super) fn to_pb(self, bucket_id: BucketId) -> Vec<BucketAction> {
        let (grant, ttl) = match self {
            BucketAssignment::Abandon => {
                return vec![BucketAction {
                    bucket_id: Some(bucket_id),
                    bucket_action: Some(bucket_action::BucketAction::AbandonAction(
                        AbandonAction {},
                    )),
                }]
            }
            BucketAssignment::Grant { grant, ttl } => (grant, ttl),
        };
        let action = |strategy: Strategy| BucketAction {
            bucket_id: Some(bucket_id.clone()),
            bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    assignment_time_to_live: Some(PbDuration {
                        seconds: ttl.as_secs() as i64,
                        nanos: 0,
                    }),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(strategy),
                    }),
                },
            )),
        };
        let deny = action(Strategy::BlanketRule(BlanketRule::DenyAll as i32));
        match assign::BucketShape::of(grant, ttl) {
            None => vec![deny],
            Some(shape) => vec![
                deny,
                action(Strategy::TokenBucket(TokenBucket {
                    max_tokens: shape.max_tokens,
                    tokens_per_fill: Some(UInt32Value {
                        value: shape.tokens_per_fill,
                    }),
                    fill_interval: Some(PbDuration {
                        seconds: shape.fill_interval_s as i64,
                        nanos: 0,
                    }),
                })),
            ],
        }
    }
}
