//! Local parts for running tally without infrastructure: the demo, the tests and the benchmark
//! use them; the service's library does not.
//!
//! - [`local_redis`]: `redis-server` (standalone or a cluster) on free loopback ports.
//! - [`certs`]: a private CA with server and client certificates (`openssl`), for TLS.
//! - [`envoy`]: a real Envoy in front of an app, with the rate-limit filter asking tally's RLS.
//! - [`gen`]: a deterministic synthetic event generator (Zipf-distributed keys).
//! - [`produce`]: a load producer and an in-process Kafka-protocol broker (librdkafka's mock
//!   cluster).
//! - [`proxy`]: a fault-injecting TCP proxy (delay, pause, blackhole, reset, refusal, a lost
//!   reply) in front of Redis or a broker.
//! - [`http`]: a blocking HTTP client for loopback servers (tally, Prometheus).
//! - [`scrape`]: Prometheus' text format read into samples, one scrape of `/metrics`.
//! - [`tansu`]: the tansu Kafka broker (SQLite storage, SASL/SCRAM) as a restartable child process.
//! - [`wait`]: polling a condition up to a deadline, instead of sleeping.
//! - [`wrk`]: `wrk --latency` against a loopback URL, its report read back.

pub mod certs;
pub mod envoy;
pub mod gen;
pub mod http;
pub mod local_redis;
pub mod produce;
pub mod proxy;
pub mod scrape;
pub mod tansu;
pub mod wait;
pub mod wrk;
