//! # tally: exact, time-windowed counters from Kafka into Redis, and a request path over them
//!
//! The counter model, the Redis connection, the script registry and the request primitives
//! (hit, rate limits, quotas, once, unique, pools, locks) live in the `tally_counters` library
//! crate (`crates/tally-counters`), which needs no Kafka; this crate re-exports its model modules
//! ([`key`], [`model`], [`window`]) and builds the service on it.
//!
//! # Layout
//!
//! Each folder is a stage; imports run one way, down this list (`tally-layers`, run by the
//! test command, checks it from the parsed source, and that this list names every module of
//! the top level and of `api/`):
//!
//! * `main.rs` and `cli/` (binary only): arguments, `tally key`/`state`/`request`/`top`/`demo`.
//! * [`app`]: one [`app::Tally`] per process, built by one function for `tally run` (consumer
//!   lanes + what `serve` serves) and `tally serve` (no Kafka); every long-lived task under one
//!   [`app::Supervisor`] (the first that fails stops the others; a signal drains them all).
//! * [`api`]: the request path's ports: [`api::http`] (REST, metrics, health, status page,
//!   OpenAPI), [`api::rls`] (Envoy's rate limit service over gRPC), [`api::rlqs`] (Envoy's
//!   rate limit quota service, on the same port), [`api::edge`] (what both ports share:
//!   bounded accept, the bearer-token check, TLS), [`api::primitives`] (the library's
//!   primitives behind the configuration and metrics), [`api::query`] (ranges of windows).
//! * [`jobs`]: work led by one replica at a time: the TTL auditor, the reconciler, and the
//!   window publisher's loop ([`stream::publish`]).
//! * [`stream`]: the stream path, in data order (below).
//! * [`ops`]: what every stage reports into: [`ops::metrics`] (one registry), [`ops::status`]
//!   (the live view of the status page and `tally top`), [`ops::health`] (readiness).
//! * [`config`]: inert serde sections, validated up front, compiled once into a
//!   [`config::Model`] (counters and their filters, each topic's decoding with its schema file
//!   read once, key layout, fence scope, the RLS limits file, the tokens), shared behind an
//!   `Arc` by every path. It also holds what the compiled model runs: the CEL evaluator of
//!   filters and derived fields (`config/cel/`) and the Protobuf descriptor reader
//!   (`config/proto.rs`).
//!
//! # The stream path
//!
//! 1. [`stream::consumer`]: in each lane, one thread owns a Kafka consumer of one topic (a
//!    member of the group; lanes and replicas share partitions; with several topics, each has
//!    `kafka.consumers` lanes of its own, decoding its events its way, so fences and exactness
//!    are per topic-partition). Rebalance callbacks run on it, so revoked
//!    partitions are flushed first. Its worker routes between small owners: the flush in flight
//!    (`consumer::flush`), commits (`consumer::commit`), partition states and recovery (a pure
//!    decision from what Redis and Kafka hold, `consumer::recovery`).
//! 2. [`stream::decode`]: a payload (JSON, Avro or Protobuf) becomes an event: dimension
//!    values (borrowed from the message), integer values and an event time. Bad messages are counted by reason and
//!    skipped (or dead-lettered); they never stop the stream.
//! 3. [`model`]: every counter is compiled once into a [`model::CounterSpec`] — its [`window`]
//!    (aligned in a time zone, DST-safe), its [`key`] template (values escaped so keys are
//!    injective) and its expiry — and [`model::layout`] decides key names: plain keys standalone;
//!    in a cluster each key gets the hash tag of its shard, so a unit and its applied offset share
//!    one slot. [`model::overlap`] proves that no two counters (and no counter and tally's state)
//!    can write one key.
//! 4. [`stream::aggregate`]: deltas are summed in memory per key and window, grouped into
//!    *units*: the contributions of one partition's offsets `[start, end)` to one shard. An
//!    event is checked before it is applied, so it counts in every counter or in none.
//! 5. [`stream::sink`]: one task owns the Redis connection (standalone or cluster) and applies
//!    units with pipelined Lua scripts (INCRBY + absolute expiry), retrying until they land. The
//!    scripts live in `src/stream/sink/lua/` (one prelude holds the fence check every write
//!    script uses); [`stream::sink::script`] builds the calls, `sink/reply.rs` parses replies.
//! 6. Offsets are committed to Kafka after the flush that contains them has landed.
//!
//! [`stream::state`] is `tally state`, which inspects and repairs the fences.
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

pub mod api;
pub mod app;
pub mod config;
pub mod jobs;
pub mod ops;
pub mod stream;

pub use tally_counters::{key, model, window};
