//! Window results published downstream (`src/stream/publish/`): final and updating windows,
//! late events, retries, tombstones, partitioning, topics, and a Redis Cluster.

mod behind;
mod cluster;
pub(crate) mod late;
mod partitioner;
mod records;
pub(crate) mod results;
pub(crate) mod retry;
mod tombstones;
mod topics;
mod updates;
