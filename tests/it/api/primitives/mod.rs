//! The request-path primitives (`src/api/primitives/`: quotas, limits, once, locks, deferred hits)
//! on the Redis deployments they run on and through the faults those have.

mod clock_skew;
mod cluster_durability;
mod defer;
mod locks;
mod proxy_faults;
mod replication;
mod sentinel;
