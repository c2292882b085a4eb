//! The request path's ports and what they call: [`edge`] (accepting connections and checking
//! tokens, shared by both ports), [`http`] (the REST API, metrics, health, the
//! status page), [`rls`] (Envoy's rate limit service over gRPC), [`rlqs`] (Envoy's rate limit
//! quota service, on the same port), [`primitives`] (the library's
//! hit, limit, quota, once, unique, pool and locks behind the configuration and metrics), and
//! [`query`] (counter values over ranges of windows).

pub mod edge;
pub mod http;
pub mod primitives;
pub mod query;
pub mod rlqs;
pub mod rls;
