//! Parse: a `ShouldRateLimit` request read into the call the decision takes. Everything a
//! caller can get wrong is refused here (no domain, no descriptor, past the caps, a limit
//! override Envoy does not define); what is left borrows from the message.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use smallvec::SmallVec;

use super::error::RlsError;
use super::sizes::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_BYTES};
use crate::config::limits::Unit;

/// One call, checked.
#[derive(Debug)]
pub struct RlsCall<'a> {
    /// The domain (not empty, within the caps).
    pub domain: &'a str,
    /// The request's `hits_addend` (0 when unset), for descriptors without their own.
    pub hits_addend: u32,
    /// One per descriptor, in order (at least one; inline up to four: no allocation per call
    /// for the usual few).
    pub descriptors: SmallVec<[Descriptor<'a>; 4]>,
}

/// One descriptor of a call.
#[derive(Debug, Clone, Copy)]
pub struct Descriptor<'a> {
    /// Its entries, read through [`Descriptor::entries`] as `(key, value)` pairs.
    entries: &'a [Entry],
    /// Its own limit (Envoy's override), checked.
    pub limit: Option<LimitOverride>,
    /// Its own addend, when set (0 = check only).
    pub hits_addend: Option<u64>,
    /// Envoy's `is_negative_hits`: the addend is given back.
    pub refund: bool,
}

/// A descriptor's own limit: so many requests per unit (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

impl<'a> RlsCall<'a> {
    /// `req`, checked: a domain, at least one descriptor, the caps of [`super::sizes`], limit
    /// overrides with a known unit and a limit above 0.
    pub fn from_pb(req: &'a RateLimitRequest) -> Result<RlsCall<'a>, RlsError> {
        if req.domain.is_empty() {
            return Err(RlsError::NoDomain);
        }
        if req.descriptors.is_empty() {
            return Err(RlsError::NoDescriptors);
        }
        check_sizes(req)?;
        let descriptors = req
            .descriptors
            .iter()
            .map(|d| {
                Ok(Descriptor {
                    entries: &d.entries,
                    limit: d.limit.as_ref().map(limit_override).transpose()?,
                    hits_addend: d.hits_addend.as_ref().map(|v| v.value),
                    refund: d.is_negative_hits,
                })
            })
            .collect::<Result<_, RlsError>>()?;
        Ok(RlsCall {
            domain: &req.domain,
            hits_addend: req.hits_addend,
            descriptors,
        })
    }

    /// The addend of `d`: its own when set (0 = check only), else max(1, the request's), as
    /// envoyproxy/ratelimit's `GetHitsAddends`.
    pub fn addend(&self, d: &Descriptor) -> u64 {
        match d.hits_addend {
            Some(v) => v,
            None => u64::from(self.hits_addend.max(1)),
        }
    }
}

impl<'a> Descriptor<'a> {
    /// Its entries, `(key, value)`, in order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone + 'a {
        self.entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
    }

    /// The number of its entries.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Its last entry.
    pub fn last(&self) -> Option<(&'a str, &'a str)> {
        self.entries
            .last()
            .map(|e| (e.key.as_str(), e.value.as_str()))
    }
}

fn limit_override(o: &RateLimitOverride) -> Result<LimitOverride, RlsError> {
    let unit = Unit::from_code(o.unit).ok_or(RlsError::OverrideUnit { unit: o.unit })?;
    if o.requests_per_unit == 0 {
        return Err(RlsError::OverrideZero);
    }
    Ok(LimitOverride {
        requests_per_unit: o.requests_per_unit,
        unit,
    })
}

/// Refuse a call whose sizes exceed the caps above, naming what is too big.
fn check_sizes(req: &RateLimitRequest) -> Result<(), RlsError> {
    if req.domain.len() > MAX_VALUE_BYTES {
        return Err(RlsError::LongDomain {
            bytes: req.domain.len(),
        });
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(RlsError::TooManyDescriptors {
            count: req.descriptors.len(),
        });
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(RlsError::TooManyEntries {
                descriptor: i,
                count: d.entries.len(),
            });
        }
        for e in &d.entries {
            if e.key.len() > MAX_VALUE_BYTES {
                return Err(RlsError::LongKey {
                    descriptor: i,
                    bytes: e.key.len(),
                });
            }
            if e.value.len() > MAX_VALUE_BYTES {
                return Err(RlsError::LongValue {
                    descriptor: i,
                    key: e.key.clone(),
                    bytes: e.value.len(),
                });
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
    use crate::api::rls::error::RlsErrorKind;

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
            let error = check_sizes(&req).unwrap_err();
            assert_eq!(error.kind(), RlsErrorKind::Invalid);
            assert!(error.to_string().contains(says), "{error}");
        }
    }
}
