//! The stream path (`src/stream/`): Kafka → decode → aggregate → flush to Redis → commit, exactly once
//! through crashes, rebalances and Redis failovers (cluster, sentinel, replication lag).

pub(crate) mod cluster;
mod consumer;
mod decode;
mod events_crash;
pub(crate) mod exactly_once;
pub(crate) mod failover;
mod faults;
mod group;
mod hostile;
mod kinds;
mod pipeline;
mod redis_security;
mod rollback;
mod sentinel;
mod sink;
mod state_loss;
mod tansu;
pub(crate) mod window;
