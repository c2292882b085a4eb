//! The caps on one `ShouldRateLimit` call: what a caller can make tally hold (and Redis store).
//! [`super::call`] refuses a call past them.

/// Most descriptors in one call (Envoy sends one per matching rate limit action).
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;
/// Longest domain, descriptor key or value, in bytes: values become parts of Redis keys, and a
/// caller must not make tally hold (or Redis store) megabytes per call.
pub const MAX_VALUE_BYTES: usize = 512;
