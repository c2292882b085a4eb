//! The caps on one `ShouldRateLimit` call: what a caller can make tally hold (and Redis store).

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

/// Most descriptors in one call (Envoy sends one per matching rate limit action).
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;
/// Longest domain, descriptor key or value, in bytes: values become parts of Redis keys, and a
/// caller must not make tally hold (or Redis store) megabytes per call.
pub const MAX_VALUE_BYTES: usize = 512;

/// Refuse a call whose sizes exceed the caps above (INVALID_ARGUMENT, naming what is too big).
#[allow(clippy::result_large_err)] // answered as it is
pub(super) fn check_sizes(req: &RateLimitRequest) -> Result<(), Status> {
    let too_long = |what: &str, n: usize| {
        Status::invalid_argument(format!(
            "{what} is {n} bytes; at most {MAX_VALUE_BYTES} are accepted"
        ))
    };
    if req.domain.len() > MAX_VALUE_BYTES {
        return Err(too_long("the domain", req.domain.len()));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are accepted",
            req.descriptors.len()
        )));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES} are accepted",
                d.entries.len()
            )));
        }
        for e in &d.entries {
            if e.key.len() > MAX_VALUE_BYTES {
                return Err(too_long(&format!("descriptor {i}'s key"), e.key.len()));
            }
            if e.value.len() > MAX_VALUE_BYTES {
                return Err(too_long(
                    &format!("descriptor {i}'s value of `{}`", e.key),
                    e.value.len(),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

    use super::*;

    fn request(
        domain: &str,
        entries: Vec<(String, String)>,
        descriptors: usize,
    ) -> RateLimitRequest {
        let d = RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            ..Default::default()
        };
        RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![d; descriptors],
            ..Default::default()
        }
    }

    #[test]
    fn calls_beyond_the_caps_are_invalid_arguments() {
        let long = "x".repeat(MAX_VALUE_BYTES + 1);
        let at_cap = "x".repeat(MAX_VALUE_BYTES);
        let ok = request(
            &at_cap,
            vec![(at_cap.clone(), at_cap.clone())],
            MAX_DESCRIPTORS,
        );
        assert!(check_sizes(&ok).is_ok());
        for (req, says) in [
            (request(&long, vec![], 1), "the domain"),
            (
                request("d", vec![(long.clone(), "v".into())], 1),
                "descriptor 0's key",
            ),
            (
                request("d", vec![("k".into(), long.clone())], 1),
                "descriptor 0's value of `k`",
            ),
            (
                request("d", vec![], MAX_DESCRIPTORS + 1),
                "descriptors; at most",
            ),
            (
                request("d", vec![("k".into(), "v".into()); MAX_ENTRIES + 1], 1),
                "entries; at most",
            ),
        ] {
            let status = check_sizes(&req).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(says), "{}", status.message());
        }
    }
}
