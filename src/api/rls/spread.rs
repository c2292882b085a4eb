//! Where a call's keys live (`rls.spread`), and how a call whose keys fall in several hash
//! slots is decided.
//!
//! With `domain`, every key of a domain carries the domain's hash tag: one slot (one cluster
//! node) holds and decides the whole domain, each call in one atomic script. With `subject`,
//! each descriptor's keys carry the tag of its own subject (the domain and the descriptor's
//! values), so different users, routes or tenants land on different slots; quotas keep the
//! domain's tag, so a call's quotas are still decided together. A call whose keys share one tag
//! (one descriptor, or several of one subject) is one atomic script as before. A call whose keys
//! have several tags is decided group by group, in the order of its descriptors:
//! - each group is one atomic script, so no limit ever admits past its count, whatever the
//!   concurrency (each key is checked and charged in one step on its own slot);
//! - once a group denies, the groups after it are only read (a peek: nothing charged), except
//!   groups made only of settles, which settle as they would in one script;
//! - the groups decided before the denial are then given back what they recorded, one refund
//!   call per slot (`lua/refund.lua`; a reservation is released by a settle of 0). Between the
//!   two calls those units are held by a call that was denied, which can deny a concurrent call
//!   (never admit one too many). A sliding log gives back its newest entries, a GCRA its
//!   arrival time, never before now; a window that ended meanwhile keeps its count. If the
//!   refund cannot reach Redis, the units stay charged (logged), as envoyproxy/ratelimit
//!   charges every descriptor of every call.

use tally_counters::request::{
    decide_settling, Ask, Client, Decision, Phase, PolicyVerdict, RequestError, Reservation,
    Settled,
};

use crate::config::Spread;

/// Decide `asks` (the call's, in descriptor order) for `domain`, by `spread`.
pub(super) async fn decide(
    client: &Client,
    asks: &[Ask<'_>],
    domain: &str,
    peek: bool,
    spread: Spread,
) -> Result<(Decision, Vec<Option<Settled>>), RequestError> {
    if spread == Spread::Domain {
        // Every key in the domain's slot: one script, nothing to group (no allocation per call).
        return decide_settling(client, asks, domain, peek).await;
    }
    let groups = groups(asks, domain, spread);
    if groups.len() == 1 {
        return decide_settling(client, asks, groups[0].0, peek).await;
    }
    let mut policies: Vec<Option<PolicyVerdict>> = vec![None; asks.len()];
    let mut settled = vec![None; asks.len()];
    let (mut admitted, mut without_redis, mut now_ms) = (true, false, 0);
    // What each admitted group recorded, to give back if a later group denies.
    let mut recorded: Vec<(&str, Vec<Ask>)> = Vec::new();
    for (tag, members) in &groups {
        let part: Vec<Ask> = members.iter().map(|&i| asks[i]).collect();
        let settles_only = part
            .iter()
            .all(|a| a.reservation.is_some_and(|r| r.phase == Phase::Settle));
        let read_only = peek || (!admitted && !settles_only);
        let (d, s) = decide_settling(client, &part, tag, read_only).await?;
        if !read_only && d.admitted {
            let back: Vec<Ask> = part
                .iter()
                .zip(&d.policies)
                .filter(|(a, v)| v.allowed && a.cost > 0)
                .filter_map(|(a, _)| refund_of(a))
                .collect();
            if !back.is_empty() {
                recorded.push((tag, back));
            }
        }
        if admitted && !d.admitted && !peek {
            give_back(client, &recorded).await;
        }
        admitted &= d.admitted;
        without_redis |= d.without_redis;
        now_ms = now_ms.max(d.now_ms);
        for ((&i, v), s) in members.iter().zip(d.policies).zip(s) {
            policies[i] = Some(v);
            settled[i] = s;
        }
    }
    let decision = Decision {
        admitted,
        policies: policies.into_iter().flatten().collect(),
        without_redis,
        now_ms,
    };
    Ok((decision, settled))
}

/// The ask that gives back what `a` recorded: a refund of its cost, or for a reservation a
/// settle of 0 (which releases it); `None` for what is final (a settle, a charge without a
/// request id on a reserving limit).
fn refund_of<'a>(a: &Ask<'a>) -> Option<Ask<'a>> {
    match a.reservation {
        Some(r) if r.phase == Phase::Reserve && !r.id.is_empty() => Some(Ask {
            cost: 0,
            reservation: Some(Reservation {
                phase: Phase::Settle,
                ..r
            }),
            ..*a
        }),
        Some(_) => None,
        None if a.refund => None,
        None => Some(Ask { refund: true, ..*a }),
    }
}

/// Refund what the groups before a denial recorded (each slot one call).
async fn give_back(client: &Client, recorded: &[(&str, Vec<Ask<'_>>)]) {
    for (tag, asks) in recorded {
        if let Err(e) = decide_settling(client, asks, tag, false).await {
            tracing::warn!(error = %e, "rls: a denied call's units on another slot could not be given back");
        }
    }
}

/// The call's asks grouped by hash tag, groups in the order of their first ask.
fn groups<'a>(asks: &'a [Ask<'_>], domain: &'a str, spread: Spread) -> Vec<(&'a str, Vec<usize>)> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::with_capacity(asks.len());
    for (i, a) in asks.iter().enumerate() {
        let tag = match spread {
            Spread::Subject if !a.quota => a.subject,
            _ => domain,
        };
        match groups.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, members)) => members.push(i),
            None => groups.push((tag, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tally_counters::request::{Algorithm, LimitPolicy};

    #[test]
    fn subjects_group_apart_and_quotas_stay_with_the_domain() {
        let policy = LimitPolicy {
            name: "p".into(),
            algorithm: Algorithm::Fixed,
            limit: 10,
            window: Duration::from_secs(60),
            burst: None,
            shadow: false,
            on_redis_error: Default::default(),
            durability: None,
        };
        let ask = |subject: &'static str, quota: bool| Ask {
            policy: &policy,
            subject,
            cost: 1,
            usage: false,
            quota,
            reservation: None,
            refund: false,
        };
        let asks = [
            ask("d:user:a", false),
            ask("d:route:r", false),
            ask("d:q:1", true),
            ask("d:user:a", false),
            ask("d:q:2", true),
        ];
        let by_subject = groups(&asks, "d", Spread::Subject);
        assert_eq!(
            by_subject,
            vec![
                ("d:user:a", vec![0, 3]),
                ("d:route:r", vec![1]),
                ("d", vec![2, 4])
            ]
        );
        assert_eq!(
            groups(&asks, "d", Spread::Domain),
            vec![("d", vec![0, 1, 2, 3, 4])]
        );
    }
}
