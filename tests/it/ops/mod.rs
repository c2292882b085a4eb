//! What operators see (`src/ops/`): metrics, dashboards and alerts, the status page, logs, lag and
//! readiness.

mod lag;
mod logs;
mod observability;
mod readiness;
mod status_page;
