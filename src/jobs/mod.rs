//! Jobs that must run on one replica at a time. Every replica runs [`run`]; for each enabled
//! job, the replica that holds the job's lock (a lease renewed by a watchdog, see
//! `tally_counters::lock`) works, the others wait to take over when the lease is released or
//! runs out (a leader killed with SIGKILL loses it after one lease).
//!
//! - [`ttl_audit`]: counter keys without expiry get the one their window implies.
//! - [`reconcile`]: recently closed windows are recounted from Kafka and compared with Redis;
//!   mismatches are reported (metric and log naming the key), never "fixed".
//! - [`crate::stream::publish`]: closed windows of counters with an output go to Kafka.

mod error;
pub mod reconcile;
pub mod ttl_audit;

pub use error::JobError;

use std::future::Future;
use std::time::Duration;

use tally_counters::lock::{LockGuard, Locks};
use tally_counters::request::Client;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::config::Model;
use crate::ops::log_limit::LogLimiter;
use crate::ops::metrics::Metrics;

/// Run every enabled job's leadership loop until `stop`.
pub async fn run(
    model: Arc<Model>,
    client: Client,
    metrics: Metrics,
    stop: CancellationToken,
) -> Result<(), JobError> {
    let config = &model.config;
    let locks = Locks::new(client.clone());
    let (audit, recount) = (&config.jobs.ttl_audit, &config.jobs.reconcile);
    let leader = |job, lease, interval| Leadership {
        job,
        locks: &locks,
        lease,
        interval,
        metrics: &metrics,
        stop: &stop,
    };
    let a = async {
        if audit.enabled {
            let pass =
                || ttl_audit::pass(&client, &model.counters, audit.keys_per_second, &metrics);
            let l = leader("ttl_audit", audit.lease, audit.interval);
            l.run(pass, || {}).await;
        }
    };
    let r = async {
        if recount.enabled {
            let job = reconcile::Reconciler::new(model.clone(), &client, &metrics);
            let l = leader("reconcile", recount.lease, recount.interval);
            l.run(|| job.pass(), || {}).await;
        }
    };
    let p = async {
        if model.has_outputs() {
            let publish = &config.jobs.publish;
            let job = crate::stream::publish::Publisher::new(model.clone(), &client, &metrics)?;
            let l = leader("publish", publish.lease, publish.interval);
            l.run(|| job.pass(), || job.step_down()).await;
        }
        Ok::<(), JobError>(())
    };
    let ((), (), p) = tokio::join!(a, r, p);
    p?;
    // With no job enabled there is nothing to lead: wait with the other tasks.
    stop.cancelled().await;
    Ok(())
}

/// One job's leadership: its lock (`job:<job>`), held for `lease` and renewed, and a pass
/// every `interval` while it is held, until `stop`.
struct Leadership<'a> {
    job: &'static str,
    locks: &'a Locks,
    lease: Duration,
    interval: Duration,
    metrics: &'a Metrics,
    stop: &'a CancellationToken,
}

impl Leadership<'_> {
    /// Hold the leadership when it can, and run `pass` every interval while holding it;
    /// `step_down` runs when the leadership ends (a former leader's gauges must not linger).
    async fn run<F, Fut, E>(&self, pass: F, step_down: impl Fn())
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let (job, metrics, stop) = (self.job, self.metrics, self.stop);
        let name = format!("job:{job}");
        let leader = metrics.jobs.leader.with_label_values(&[job]);
        // Listed on the status page from the start, as a follower until it leads.
        metrics.status.job_leader(job, false);
        while !stop.is_cancelled() {
            let held = match self.locks.try_acquire(&name, self.lease).await {
                Ok(Ok(held)) => held,
                Ok(Err(_busy)) => {
                    pause(self.lease / 3, stop).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(job, error = %e, "cannot reach redis for leadership");
                    pause(self.lease / 3, stop).await;
                    continue;
                }
            };
            tracing::info!(job, fence = held.fence, "leading");
            leader.set(1);
            metrics.status.job_leader(job, true);
            let mut guard = self.locks.guard(held, None);
            self.lead(&mut guard, &pass).await;
            leader.set(0);
            metrics.status.job_leader(job, false);
            step_down();
            if guard.is_lost() {
                tracing::warn!(job, "leadership lost");
            }
            let _ = guard.release().await;
        }
    }

    /// While `guard` holds the lock: a pass, then the interval, until stopped or lost.
    async fn lead<F, Fut, E>(&self, guard: &mut LockGuard, pass: &F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let (job, metrics, stop) = (self.job, self.metrics, self.stop);
        // A pass that fails fails again at every interval until its cause is gone: one line
        // per 10 s says so (the status page has the last error).
        let failed = LogLimiter::new();
        let runs = metrics.jobs.runs.with_label_values(&[job]);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = guard.lost() => break,
                result = pass() => {
                    let at = crate::ops::status::unix_ms();
                    match result {
                        Ok(()) => {
                            runs.inc();
                            metrics.status.job_ran(job, at, None);
                        }
                        Err(e) => {
                            if let Some(repeated) = failed.allow() {
                                tracing::warn!(job, error = %e, repeated, "pass failed; retrying next interval");
                            }
                            metrics.status.job_ran(job, at, Some(e.to_string()));
                        }
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = guard.lost() => break,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

async fn pause(d: Duration, stop: &CancellationToken) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
