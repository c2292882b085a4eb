//! Metrics of the jobs that run on one replica at a time.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// Leadership and the TTL auditor's findings.
#[derive(Clone)]
pub struct JobMetrics {
    /// 1 on the replica that holds a job's leadership, by job.
    pub leader: IntGaugeVec,
    /// Completed passes, by job.
    pub runs: IntCounterVec,
    /// Keys the TTL auditor inspected, by counter.
    pub keys_scanned: IntCounterVec,
    /// Keys found without expiry and given the one their window implies, by counter.
    pub keys_repaired: IntCounterVec,
    /// Keys the reconciler compared with its recount from Kafka, by counter.
    pub reconciled: IntCounterVec,
    /// Keys whose Redis value differed from the recount, by counter.
    pub mismatches: IntCounterVec,
}

impl JobMetrics {
    pub(super) fn new(registry: &Registry, counters: &[String]) -> JobMetrics {
        let counter = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("static metric");
            super::register(registry, c, "counter")
        };
        let leader = IntGaugeVec::new(
            Opts::new(
                "tally_job_leader",
                "1 on the replica leading a job, by task (the job's name; Prometheus owns `job`).",
            ),
            &["task"],
        )
        .expect("static metric");
        let leader = super::register(registry, leader, "gauge");
        let m = JobMetrics {
            leader,
            runs: counter(
                "tally_job_runs_total",
                "Completed job passes, by task (the job).",
                "task",
            ),
            keys_scanned: counter(
                "tally_ttl_audit_keys_scanned_total",
                "Counter keys the TTL auditor inspected, by counter.",
                "counter",
            ),
            keys_repaired: counter(
                "tally_ttl_audit_keys_repaired_total",
                "Counter keys found without expiry and given the expiry of their window, by counter.",
                "counter",
            ),
            reconciled: counter(
                "tally_reconcile_keys_checked_total",
                "Keys the reconciler compared with its recount from Kafka, by counter.",
                "counter",
            ),
            mismatches: counter(
                "tally_reconcile_mismatches_total",
                "Keys whose Redis value differed from the reconciler's recount from Kafka, by counter.",
                "counter",
            ),
        };
        for job in ["ttl_audit", "reconcile", "publish"] {
            m.leader.with_label_values(&[job]);
            m.runs.with_label_values(&[job]);
        }
        for c in counters {
            m.keys_scanned.with_label_values(&[c]);
            m.keys_repaired.with_label_values(&[c]);
            m.reconciled.with_label_values(&[c]);
            m.mismatches.with_label_values(&[c]);
        }
        m
    }
}
