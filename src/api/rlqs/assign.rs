//! The assignment: how many requests of one bucket's global budget an Envoy may admit until its
//! next report. Pure: the numbers come from the ledger in Redis (`rlqs_report.lua`) and the
//! grant is stored by `rlqs_grant.lua`, which applies [`cap`] atomically.
//!
//! # The ledger and its invariant
//!
//! Per bucket and window, Redis holds `used` (the requests every Envoy reported allowed in the
//! window) and, per Envoy, the *reservation* it holds: the grant it was last sent plus a
//! reserve for what it may still admit from its previous assignment while its report travels
//! (until its answer is applied). A grant is an Envoy token bucket that admits at most the
//! grant in its lifetime ([`BucketShape`]).
//! [`cap`] keeps, at every report,
//!
//! ```text
//! used + Σ reservations ≤ limit
//! ```
//!
//! and every request an Envoy admits is inside a reservation until its next report moves it
//! into `used`. Hence the only requests outside are those it admits from a replaced assignment
//! beyond the reserve (`gap`): the **global overshoot in one window** is at most
//!
//! ```text
//! Σ over reports in the window of max(0, r'·t − r·a)
//! ```
//!
//! with `r` the demand it reported (requests/s), `r'` its request rate between sending a report
//! and applying the answer, `t` that time (the round trip) and `a` the reserve's allowance
//! (`GAP_ALLOWANCE`): **zero** while round trips stay under the allowance and demand does not
//! rise more than `a/t`-fold within one round trip. A demand change never overshoots beyond
//! that: a rising demand is denied until the next report (at most `(r' − r·headroom)·period`
//! requests denied that the budget had room for), a falling one leaves its grant unused until
//! then. Outside the server's control, and so outside the bound: what Envoy admits before its
//! first assignment (`no_assignment_behavior`) and after an assignment expires
//! (`expired_assignment_behavior`) — configure both to deny, or to a small bucket.

use std::time::Duration;

use tally_counters::request::{LedgerAsk, Need, Standing};

use crate::config::RlqsBucket;

/// What one Envoy asks of a bucket: its measured demand and when it reports again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Requests matched into the bucket per second (allowed + denied) over its last report
    /// interval: what it would admit with no limit.
    pub rate: f64,
    /// Time between its reports, as measured.
    pub period: Duration,
}

/// The window's budget as the ledger holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Requests the window admits across every Envoy.
    pub limit: u64,
    /// Requests reported allowed in the window so far.
    pub used: u64,
}

/// How generous an assignment is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// The demand is multiplied by this, so that a rising demand is met until the next report.
    pub headroom: f64,
    /// Added to every need, so that an idle Envoy can start a burst.
    pub floor: u64,
}

/// Time an answer may take to reach the Envoy that reported; what it admits from its previous
/// assignment meanwhile (at its reported rate) is reserved.
pub const GAP_ALLOWANCE: Duration = Duration::from_millis(100);

impl Demand {
    /// Requests it needs until its next report: `rate × period × headroom + floor`.
    pub fn need(&self, t: Tuning) -> u64 {
        let n = (self.rate.max(0.0) * self.period.as_secs_f64() * t.headroom).ceil();
        (n.min(f64::from(u32::MAX)) as u64).saturating_add(t.floor)
    }

    /// What it may admit from its previous assignment while its report travels: its rate over
    /// [`GAP_ALLOWANCE`], rounded up.
    pub fn gap(&self) -> u64 {
        let n = (self.rate.max(0.0) * GAP_ALLOWANCE.as_secs_f64()).ceil();
        n.min(f64::from(u32::MAX)) as u64
    }
}

/// The demand assumed at a bucket's first report in a stream, where none is measured yet (Envoy
/// sends it at the bucket's first request, under `no_assignment_behavior`): the mean of the
/// other Envoys' demands, since a new Envoy behind the same balancer (a scale-up, a rolling
/// deploy) takes about as much; and at least the window's budget at an even pace, shared with
/// them. Never below what it measured. Without it a new Envoy is granted one request per report
/// interval until its second report, and denies nearly all its traffic meanwhile however far
/// the window is from its limit.
pub fn first_rate(measured: f64, others: &[Demand], limit: u64, window: Duration) -> f64 {
    let holders = others.len() as f64 + 1.0;
    let pace = limit as f64 / window.as_secs_f64().max(0.001) / holders;
    let sum: f64 = others.iter().map(|d| d.rate.max(0.0)).sum();
    let mean = if others.is_empty() {
        0.0
    } else {
        sum / others.len() as f64
    };
    measured.max(pace).max(mean)
}

/// The grant to ask for: its need while the budget left covers every Envoy's need, else the
/// budget left split in proportion to the needs (rounded up; [`cap`] keeps the sum within).
pub fn desired(budget: Budget, me: Demand, others: &[Demand], t: Tuning) -> u64 {
    let left = u128::from(budget.limit.saturating_sub(budget.used));
    let mine = u128::from(me.need(t));
    let total = mine + others.iter().map(|d| u128::from(d.need(t))).sum::<u128>();
    if total <= left {
        return mine as u64;
    }
    (left * mine).div_ceil(total.max(1)) as u64
}

/// A report's demand, as its session measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The reporting Envoy's demand.
    pub demand: Demand,
    /// The bucket's first report on the stream: no demand measured yet ([`first_rate`]).
    pub first: bool,
}

/// The decision after a report: what the ledger is asked to store for the reporting Envoy of
/// `bucket`, from its demand (`me`), the window's `standing` (what is used, the other Envoys'
/// needs) and the `tuning`. The reservation lasts until `expires_at_ms`. The ledger applies
/// [`cap`] to it atomically.
pub fn next_grant(
    bucket: &RlqsBucket,
    me: Measured,
    standing: &Standing,
    tuning: Tuning,
    expires_at_ms: i64,
) -> LedgerAsk {
    let others: Vec<Demand> = standing
        .others
        .iter()
        .map(|n| Demand {
            rate: n.rate_milli as f64 / 1000.0,
            period: Duration::from_millis(n.period_ms),
        })
        .collect();
    let mut demand = me.demand;
    if me.first {
        demand.rate = first_rate(demand.rate, &others, bucket.limit, bucket.window);
    }
    let budget = Budget {
        limit: bucket.limit,
        used: standing.used,
    };
    LedgerAsk {
        desired: desired(budget, demand, &others, tuning),
        gap: demand.gap(),
        limit: bucket.limit,
        expires_at_ms,
        need: Need {
            rate_milli: (demand.rate * 1000.0).min(1e15) as u64,
            period_ms: demand.period.as_millis() as u64,
        },
    }
}

/// What the ledger stores and sends after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capped {
    /// Sent to the Envoy: what it may admit from the new assignment.
    pub grant: u64,
    /// Held in the ledger for it: `grant` plus the reserve for its gap.
    pub reserved: u64,
}

/// The grant within what is left once `used` and the other Envoys' reservations
/// (`others_reserved`) are counted: the gap reserve first (it is spent already), then as much
/// of `desired` as fits. `rlqs_grant.lua` is this, run atomically.
pub fn cap(desired: u64, gap: u64, budget: Budget, others_reserved: u64) -> Capped {
    let left = budget
        .limit
        .saturating_sub(budget.used.saturating_add(others_reserved));
    let gap = gap.min(left);
    let grant = desired.min(left - gap);
    Capped {
        grant,
        reserved: grant + gap,
    }
}

/// The token bucket Envoy is sent for a grant: it starts full with `max_tokens` and gains
/// `tokens_per_fill` per `fill_interval_s`, so that in an assignment's life (at most its time to
/// live) it admits `max_tokens + tokens_per_fill × ttl / fill_interval_s` (rounded down) = the
/// grant, never more.
///
/// Why not one full bucket that never refills (`fill_interval` of an hour): Envoy's atomic token
/// bucket starts full by back-dating its last fill by the time the bucket takes to fill
/// (`max_tokens / fill rate`), and in some versions starts it empty when that is longer than the
/// monotonic clock (the host's uptime). Keeping an eighth of the grant for the refill keeps that
/// time under 14 × ttl (140 s with the default ttl); a host up for less could get empty buckets,
/// which admit less, never more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketShape {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_s: u64,
}

impl BucketShape {
    /// The bucket for `grant` requests over an assignment that lives `ttl` (whole seconds, at
    /// least one); `None` for no request (`DENY_ALL`).
    pub fn of(grant: u64, ttl: Duration) -> Option<BucketShape> {
        let grant = u32::try_from(grant).unwrap_or(u32::MAX);
        let ttl_s = ttl.as_secs().max(1);
        match (grant, grant / 8) {
            (0, _) => None,
            // Half a token in the ttl: it never completes one.
            (g, 0) => Some(BucketShape {
                max_tokens: g,
                tokens_per_fill: 1,
                fill_interval_s: 2 * ttl_s,
            }),
            (g, refill) => Some(BucketShape {
                max_tokens: g - refill,
                tokens_per_fill: refill,
                fill_interval_s: ttl_s,
            }),
        }
    }

    /// Requests it admits within `life` at most (what the grant is).
    pub fn admits(&self, life: Duration) -> u64 {
        let refill = u128::from(self.tokens_per_fill) * life.as_millis()
            / (u128::from(self.fill_interval_s) * 1000);
        u64::from(self.max_tokens) + refill as u64
    }

    /// Seconds the bucket takes to fill from empty (Envoy starts it full only past this uptime).
    pub fn fill_time_s(&self) -> u64 {
        (u64::from(self.max_tokens) * self.fill_interval_s)
            .div_ceil(u64::from(self.tokens_per_fill))
    }
}

#[cfg(test)]
#[path = "assign_tests.rs"]
mod tests;
