//! What every stage reports into: [`metrics`] (the one Prometheus registry), [`status`] (the
//! live view behind the status page and `tally top`), [`health`] (readiness), and the
//! rate-limited logging every stage shares; [`build_info`] says what this binary is.

pub mod build_info;
pub mod health;
pub(crate) mod log_limit;
pub mod metrics;
pub mod status;
