//! The background jobs (`src/jobs/`): the TTL auditor and the reconciler.

mod reconcile;
mod ttl_audit;
