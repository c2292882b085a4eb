//! The service's integration tests, one binary: each module was once a test binary of its own,
//! and each linked librdkafka and the whole service again. `common` is the in-process harness
//! (a mock Kafka broker, a real `redis-server`, tally in-process or as a process); the parts that
//! the benchmark also uses (HTTP, Prometheus scrapes, waiting) are in `tally_testkit`.
//!
//! Its folders follow `src/`. Filter by module (`cargo nextest run -E
//! 'test(/^stream::exactly_once::/)'`) or by folder (`test(/^api::rls::/)`); add `binary(it) &`
//! where the library has unit tests of the same path (`stream::decode::avro`).

mod common;

mod api;
mod app;
mod cli;
mod config;
mod jobs;
mod ops;
mod release;
mod stream;
