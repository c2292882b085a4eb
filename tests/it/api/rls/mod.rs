//! Envoy's rate limit service (`src/api/rls/`): called directly with the generated stubs (`service`
//! holds the shared client and server helpers), through real Envoys, and on Redis Cluster.

mod cluster;
mod envoy;
mod examples;
mod limits_file;
mod pause;
mod port;
mod quota;
mod refund;
mod reserve;
mod service;
