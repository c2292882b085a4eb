//! Envoy's rate limit quota service (`src/api/rlqs/`): called directly, bounded, and through real
//! Envoys.

mod bounds;
mod envoy;
pub(crate) mod service;
