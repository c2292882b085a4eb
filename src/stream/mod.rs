//! The stream path, in data order: [`consumer`] (Kafka, the worker, flushes and commits) →
//! [`decode`] (a message becomes an event) → [`aggregate`] (deltas per key and window, grouped
//! into units) → [`sink`] (one task owns the Redis connection and applies units with fenced Lua
//! scripts); [`publish`] produces closed windows' final values to Kafka, and [`state`] inspects
//! and repairs the fences (`tally state`).

pub mod aggregate;
pub mod consumer;
pub mod decode;
pub mod publish;
pub mod sink;
pub mod state;
