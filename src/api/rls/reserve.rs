//! Reserve → settle through Envoy (a limit with `reserve` in the limits file): which descriptors
//! reserve or settle, by what request id and for how many units, and what the settles did.
//!
//! Envoy sends, on the request, the limit's entries plus one entry keyed `reserve_key` whose
//! value is the request's id (from `x-request-id`), with the upper bound of the cost as the
//! descriptor's `hits_addend` (or none: the limit's `reserve.default`); at stream done
//! (`apply_on_stream_done`), the same entries plus one keyed `settle_key`, with the true cost as
//! the `hits_addend`. A descriptor with the limit's entries alone is a plain check (addend 0) or
//! charge on the same count, live reservations included.

use tally_counters::request::{Phase, Reservation, Settled};

use super::call::Descriptor;
use crate::config::limits::{FoundRule, Limits, Rule};
use crate::ops::metrics::Metrics;

/// A descriptor that ends with a reserving limit's `reserve_key` or `settle_key` entry: the limit
/// (found by the entries before it) and the phase. Asked only when the whole descriptor matched
/// no limit, so a tree that has such a key as a level of its own keeps its meaning.
pub fn lookup<'a>(
    limits: &'a Limits,
    domain: &str,
    d: &Descriptor,
) -> Option<(FoundRule<'a>, Phase)> {
    let n = d.entry_count();
    if n < 2 {
        return None;
    }
    let (last_key, _) = d.last()?;
    let found = limits.lookup(domain, d.entries().take(n - 1))?;
    let phase = found.rule.reserve.as_ref()?.phase_of(last_key)?;
    Some((found, phase))
}

/// How many of the entries make the counter's subject: all but the phase's entry.
pub fn subject_entries(d: &Descriptor, phase: Option<Phase>) -> usize {
    match phase {
        Some(_) => d.entry_count() - 1,
        None => d.entry_count(),
    }
}

/// The reservation part of a reserving limit's ask (`None` for any other limit). `phase` is
/// what [`lookup`] found; a descriptor without the phase entry reserves without an id.
pub fn reservation<'a>(
    rule: &Rule,
    d: &Descriptor<'a>,
    phase: Option<Phase>,
) -> Option<Reservation<'a>> {
    let r = rule.reserve.as_ref()?;
    let id = match phase {
        Some(_) => d.last().map_or("", |(_, value)| value),
        None => "",
    };
    Some(Reservation {
        phase: phase.unwrap_or(Phase::Reserve),
        id,
        expiry: r.expiry,
        max_extra: r.max_extra,
    })
}

/// Units of a reserving descriptor: a reservation without its own `hits_addend` reserves the
/// limit's `default` (when set); otherwise as any descriptor (`addend`; `request_addend`: the
/// request's `hits_addend`).
pub fn cost(rule: &Rule, request_addend: u32, d: &Descriptor, addend: u64) -> u64 {
    match (&rule.reserve, d.hits_addend) {
        (Some(r), None) => r.default.unwrap_or(addend.max(u64::from(request_addend))),
        _ => addend,
    }
}

/// Count what a settle did, by domain label, descriptor label and result (`settled`, `capped`:
/// settled with the true cost cut at the reservation + `max_extra`, `already_settled`,
/// `unreserved`).
pub fn count(metrics: &Metrics, domain: &str, rule: &Rule, cost: u64, settled: Settled) {
    let result = match settled {
        Settled::Settled { charged, .. } if charged < cost => "capped",
        Settled::Settled { .. } => "settled",
        Settled::AlreadySettled => "already_settled",
        Settled::Unreserved { .. } => "unreserved",
    };
    metrics
        .rls
        .settles
        .with_label_values(&[domain, &rule.label, result])
        .inc();
}
