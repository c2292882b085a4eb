//! # tally-counters: exact, time-windowed counters in Redis
//!
//! The part of tally that needs no Kafka: what a counter is and where its keys live, the Redis
//! connection, and the scripts that change counters atomically. The `tally` service builds its
//! stream path on it; programs embed it for the request path.
//!
//! * [`config`]: counter and Redis settings (serde data; [`config::RedisConfig::validate`] checks
//!   the connection settings, the counters are checked as they compile into the model).
//! * [`window`]: tumbling windows aligned in a time zone, DST-safe.
//! * [`key`]: key templates whose rendering is injective (values escaped).
//! * [`model`]: a counter compiled once ([`model::CounterSpec`]), the key layout on a cluster
//!   ([`model::layout`]), the names of tally's own state keys, and the proof that no two counters
//!   can write one key.
//! * [`conn`]: one multiplexed connection handle for a server or a cluster.
//! * [`script`]: Lua scripts loaded once (SCRIPT LOAD) and run by SHA, reloaded on NOSCRIPT.
//! * [`request`]: the request path: hits, rate limits, quotas, once, unique, pools.
//! * [`lock`]: locks with fencing tokens and a renewing guard.
//! * [`clock`]: the host's wall clock (one helper for every path; never what decides a limit).

// The README's example is compiled as a doctest (`cargo test --doc -p tally-counters`), so the
// front page of the crate cannot drift from its API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod clock;
pub mod config;
pub mod conn;
mod error;
pub mod key;
pub mod lock;
pub mod model;
pub mod request;
pub mod script;
pub mod window;

pub use error::Error;
