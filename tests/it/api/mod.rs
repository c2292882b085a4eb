//! The request path's ports (`src/api/`): HTTP, the edge every port shares (TLS, per-peer
//! bounds), the primitives, reading counters back, Envoy's rate limit service and quota service.

mod edge;
mod http;
mod primitives;
mod query;
mod rlqs;
mod rls;
