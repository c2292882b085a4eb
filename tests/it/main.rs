//! The service's integration tests, one binary: each module was once a test binary of its own,
//! and each linked librdkafka and the whole service again. `common` is the in-process harness
//! (a mock Kafka broker, a real `redis-server`, tally in-process or as a process); the parts that
//! the benchmark also uses (HTTP, Prometheus scrapes, waiting) are in `tally_testkit`.
//!
//! Filter by module: `cargo nextest run -E 'test(/^exactly_once::/)'`.

mod common;

mod admin_token;
mod aof;
mod avro;
mod bounded_flush;
mod cli_help;
mod clock_skew;
mod cluster;
mod config_cli;
mod config_reference;
mod contract;
mod defer;
mod docs_site;
mod envoy_example;
mod events_crash;
mod exactly_once;
mod expiry_spread;
mod failover;
mod faults;
mod fields;
mod fuzz_corpus;
mod group;
mod hostile;
mod http;
mod jobs;
mod kinds;
mod kubernetes;
mod lag;
mod lock_cli;
mod locks;
mod logs;
mod observability;
mod openapi;
mod pipeline;
mod protobuf;
mod proxy_faults;
mod query;
mod query_range;
mod readiness;
mod readme;
mod reconcile;
mod redis_security;
mod replication;
mod request_path;
mod rlqs;
mod rlqs_envoy;
mod rls;
mod rls_cluster;
mod rls_envoy;
mod rls_envoy_charge;
mod rls_envoy_quota;
mod rls_envoy_reserve;
mod rls_examples;
mod rls_limits_file;
mod rls_pause;
mod rls_port;
mod rls_quota;
mod rls_refund;
mod rls_reserve;
mod rollback;
mod schema_registry;
mod scripts;
mod sentinel;
mod sentinel_stream;
mod signals;
mod state_loss;
mod status_page;
mod tansu;
mod tls;
mod topic_patterns;
mod topics;
mod window_behind;
mod window_cluster;
mod window_late;
mod window_partitioner;
mod window_results;
mod window_retry;
mod window_tombstones;
mod window_topics;
mod window_updates;
