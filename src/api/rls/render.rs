//! Render: the decision written as Envoy's protobuf response, and a refused call as its gRPC
//! status. The only step of a call that knows the wire types of the answer.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::Status;

use super::decide::{DescriptorRuling, Ruling};
use super::error::{RlsError, RlsErrorKind};

/// The response: one status per descriptor, the overall code, the IETF headers; with
/// `metadata`, envoyproxy/ratelimit's dynamic metadata ([`super::metadata`]) of `req`.
pub fn response(req: &RateLimitRequest, ruling: Ruling, metadata: bool) -> RateLimitResponse {
    let dynamic_metadata = metadata.then(|| super::metadata::build(req, ruling.passed_metadata()));
    let statuses = ruling.descriptors.iter().map(status_of).collect();
    let mut headers = Vec::new();
    if let Some((policy, state)) = ruling.headers {
        headers.push(header("RateLimit-Policy", policy));
        if let Some(state) = state {
            headers.push(header("RateLimit", state));
        }
    }
    RateLimitResponse {
        overall_code: code(!ruling.over),
        statuses,
        response_headers_to_add: headers,
        dynamic_metadata,
        ..Default::default()
    }
}

/// The gRPC status of a call with no answer: the kind's code, the error's message.
pub fn status(e: &RlsError) -> Status {
    let code = match e.kind() {
        RlsErrorKind::Invalid => tonic::Code::InvalidArgument,
        RlsErrorKind::Unavailable => tonic::Code::Unavailable,
        RlsErrorKind::Internal => tonic::Code::Internal,
    };
    Status::new(code, e.to_string())
}

fn status_of(d: &DescriptorRuling) -> DescriptorStatus {
    DescriptorStatus {
        code: code(d.ok),
        current_limit: d.shown_limit.zip(d.rule).map(|(n, rule)| RateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(n).unwrap_or(u32::MAX),
            unit: rule.unit.code(),
        }),
        limit_remaining: d.remaining,
        duration_until_reset: d.reset_s.map(|s| PbDuration {
            seconds: i64::try_from(s).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn code(ok: bool) -> i32 {
    if ok {
        Code::Ok as i32
    } else {
        Code::OverLimit as i32
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}
