//! Local parts for running tally without infrastructure: the demo, the tests and the benchmark
//! use them; the service's library does not.
//!
//! - [`local_redis`]: `redis-server` (standalone or a cluster) on free loopback ports.
//! - [`gen`]: a deterministic synthetic event generator (Zipf-distributed keys).
//! - [`produce`]: a load producer and an in-process Kafka-protocol broker (librdkafka's mock
//!   cluster).

pub mod gen;
pub mod local_redis;
pub mod produce;
