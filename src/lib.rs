//! # tally: exact, time-windowed counters from Kafka into Redis
//!
//! The counter model, the Redis connection, the script registry and the request path (hit,
//! rate limits, quotas, once, unique, pools) live in the `tally_counters` library crate
//! (`crates/tally-counters`), which needs no Kafka; this crate re-exports its model modules
//! ([`key`], [`model`], [`window`]) and builds the stream path and the service on it.
//!
//! A configuration is loaded, validated and compiled once into a [`config::Model`] (the counters'
//! specs, the key layout, the fence scope), shared behind an `Arc` by every path below. [`app`]
//! wires the processes from it: `tally run` ([`app::Tally`]: `kafka.consumers` consumer *lanes*,
//! HTTP, jobs) and `tally serve` ([`app::serve`]: HTTP and jobs, no Kafka), every long-lived
//! task under one [`app::Supervisor`] (the first that fails stops the others; a signal drains
//! them all). [`request`] puts the library's request path behind the configuration and metrics;
//! [`jobs`] are led by one replica at a time (the TTL auditor, the reconciler, and [`publish`],
//! which produces the final values of closed windows to the counters' output topics).
//!
//! Data flows through these stages, one module each:
//!
//! 1. [`consumer`]: in each lane, one thread owns a Kafka consumer (a member of the group; lanes
//!    and replicas share partitions). Rebalance callbacks run on it, so revoked partitions are
//!    flushed first. Its worker routes between small owners: the flush in flight
//!    (`consumer::flush`), commits (`consumer::commit`), partition states and recovery (a pure
//!    decision from what Redis and Kafka hold, `consumer::recovery`).
//! 2. [`decode`]: a JSON payload becomes an [`decode::Event`]: dimension values (borrowed from
//!    the message), integer values and an event time. Bad messages are counted by reason and
//!    skipped; they never stop the stream.
//! 3. [`model`]: every counter is compiled once into a [`model::CounterSpec`] — its [`window`]
//!    (aligned in a time zone, DST-safe), its [`key`] template (values escaped so keys are
//!    injective) and its expiry — and [`model::layout`] decides key names: plain keys standalone;
//!    in a cluster each key gets the hash tag of its shard, so a unit and its applied offset share
//!    one slot. [`model::state_keys`] names tally's own keys; [`model::overlap`] proves that no
//!    two counters (and no counter and tally's state) can write one key. The model is pure (no
//!    I/O); the stream path, queries and `tally state` all use it.
//! 4. [`aggregate`]: deltas are summed in memory per key and window, grouped into *units*:
//!    the contributions of one partition's offsets `[start, end)` to one shard.
//! 5. [`sink`]: one task owns the Redis connection (standalone or cluster, [`sink::conn`]) and
//!    applies units with a pipelined Lua script (INCRBY + absolute expiry), retrying until they
//!    land. The scripts live in `src/sink/lua/` (one prelude holds the fence check every write
//!    script uses); [`sink::script`] builds the calls and parses their replies into types.
//! 6. Offsets are committed to Kafka after the flush that contains them has landed.
//!
//! [`consumer`]'s recovery decides where a partition starts from what Redis holds (see "What
//! makes a count exact"), and [`state`] is `tally state`, which inspects and repairs it.
//! [`query`] computes a counter's key for given values and reads values over ranges of windows
//! (CLI, `GET /v1/count`, `GET /v1/counters/{name}`, the batch form); [`http`]
//! serves it with `/metrics` and [`health`] (ready while a Kafka broker was reachable lately,
//! Redis answers and no partition is halted); [`status`] keeps what the stages report about
//! themselves per batch (offsets, halts with their repair command, rates, flush latency, the
//! hottest keys, decisions, jobs) for the page at `GET /`, `GET /v1/status` and `tally top`; the
//! demo (in the binary) and the `tally-testkit` crate run the pieces locally.
//!
//! ## What makes a count exact
//!
//! The flush script applies a unit and records, in the same atomic step, the offset up to
//! which that (partition, shard) has been applied:
//! `<state_prefix>applied:<group>:<topic>:<partition>:<shard>` (plus `:{tag}` in a cluster).
//! It refuses a unit whose `start` is not the recorded offset. Hence:
//! * a retry (lost reply, reconnect, NOSCRIPT) or a replay after a crash is skipped, not re-added;
//! * a replica that lost its partitions but still flushes (a zombie) is refused, and the owner
//!   resynchronises from Redis;
//! * a partition starts at the applied offset read from Redis, and a message is counted only
//!   if its offset is at or past it.
//!
//! * a unit is the contributions of offsets `[start, end)` of one partition to one shard; it
//!   ends on a message boundary and holds at most `flush.max_keys_per_call` keys (+ one message),
//!   which bounds how long one script call blocks Redis.
//!
//! Each shard also has a *state marker* (a hash that never expires, holding a copy of every
//! partition's applied offset, written by the same script call). It separates "Redis lost
//! everything" (no marker entry: rebuild from the earliest retained offset, or halt, per
//! `recovery.on_state_lost`) from "one applied offset is gone or corrupt while the rest is there"
//! (halt that partition: replaying would count twice).
//!
//! Kafka's committed offset follows Redis (for lag monitoring); Redis is the source of truth.
//! If Redis loses writes (restart without persistence, failover before replication), it loses
//! the matching applied offsets with them: the next flush finds the offset behind, the partition
//! is resynchronised from Redis and the lost range is replayed from Kafka.
//!
//! Start reading at [`app::Tally::run`].

pub mod aggregate;
pub mod app;
pub mod config;
pub mod consumer;
pub mod decode;
pub mod health;
pub mod http;
pub mod jobs;
mod log_limit;
pub mod metrics;
pub mod publish;
pub mod query;
pub mod request;
pub mod rls;
pub mod sink;
pub mod state;
pub mod status;

pub use tally_counters::{key, model, window};
