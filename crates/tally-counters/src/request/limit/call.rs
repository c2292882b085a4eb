//! One [`super::decide_settling`] call's steps: merge the asks by key, lay out the limit
//! script's call in the [`super::protocol`] order, and read its reply back per ask.

use std::borrow::Cow;

use super::protocol::{AskFlags, AskKind, IndexArgs, PolicyArgs};
use super::reply::LimitReply;
use super::{
    Algorithm, Ask, Client, Decision, Phase, RequestError, Reservation, Settled, MAX_LOG_COST,
};

/// A call's asks, one per state key: two asks on one key are decided as one, their costs summed.
pub(super) struct MergedAsks<'a> {
    /// One ask per distinct key, in call order.
    pub(super) asks: Vec<Ask<'a>>,
    /// Each merged ask's state key.
    pub(super) keys: Vec<String>,
    /// Per ask of the call, the index of the merged ask it is part of.
    pub(super) slot_of: Vec<usize>,
}

impl<'a> MergedAsks<'a> {
    /// Merge `asks` (tagged by `tag`), refusing what one call cannot ask.
    pub(super) fn of(
        client: &Client,
        asks: &[Ask<'a>],
        tag: &str,
    ) -> Result<MergedAsks<'a>, RequestError> {
        let mut merged = MergedAsks {
            asks: Vec::with_capacity(asks.len()),
            keys: Vec::with_capacity(asks.len()),
            slot_of: Vec::with_capacity(asks.len()),
        };
        for a in asks {
            check_reservation(a)?;
            let kind = match a.reservation {
                Some(_) => Reservation::KINDS.0,
                None => a.policy.algorithm.key_kind(),
            };
            let key = super::super::key(client.prefix(), kind, &a.policy.name, a.subject, tag);
            let slot = merged.slot(key, a)?;
            merged.slot_of.push(slot);
        }
        merged.check_costs()?;
        Ok(merged)
    }

    /// The index of `a`'s merged ask: a new one for a new key, else the one it adds its cost to.
    fn slot(&mut self, key: String, a: &Ask<'a>) -> Result<usize, RequestError> {
        let Some(j) = self.keys.iter().position(|k| *k == key) else {
            self.keys.push(key);
            self.asks.push(*a);
            return Ok(self.keys.len() - 1);
        };
        let same = &mut self.asks[j];
        if same.refund != a.refund {
            return Err(RequestError::Invalid(format!(
                "limit `{}`: one call both charges and refunds one count",
                a.policy.name
            )));
        }
        if same.reservation != a.reservation {
            return Err(RequestError::Invalid(format!(
                "limit `{}`: two descriptors of one call reserve or settle one count apart",
                a.policy.name
            )));
        }
        same.cost = same.cost.saturating_add(a.cost);
        Ok(j)
    }

    /// Summed costs the script can take: within what it counts in (µs of i64), and a sliding
    /// log's (one entry per unit) within [`MAX_LOG_COST`].
    fn check_costs(&self) -> Result<(), RequestError> {
        let max = i64::MAX as u64 / 1_000_000;
        if let Some(a) = self.asks.iter().find(|a| a.cost > max) {
            return Err(RequestError::Invalid(format!(
                "cost {} is out of range",
                a.cost
            )));
        }
        if let Some(a) = self
            .asks
            .iter()
            .find(|a| a.cost > MAX_LOG_COST && a.policy.algorithm == Algorithm::SlidingLog)
        {
            return Err(RequestError::Invalid(format!(
                "cost {}: a sliding_log policy takes at most {MAX_LOG_COST} units per call",
                a.cost
            )));
        }
        Ok(())
    }

    /// `client`, waiting for the strictest durability of the policies (each its own, else the
    /// client's).
    pub(super) fn durable<'c>(&self, client: &'c Client) -> Cow<'c, Client> {
        let durable = self
            .asks
            .iter()
            .map(|a| a.policy.durability.unwrap_or(client.durability()))
            .max_by_key(|d| (d.replicas, d.timeout))
            .unwrap_or(client.durability());
        match durable == client.durability() {
            true => Cow::Borrowed(client),
            false => Cow::Owned(client.durable(durable)),
        }
    }
}

/// A reserving ask's reservation, checked, and not with a refund.
fn check_reservation(a: &Ask) -> Result<(), RequestError> {
    let Some(r) = &a.reservation else {
        return Ok(());
    };
    r.validate(a.policy)?;
    if a.refund {
        return Err(RequestError::Invalid(format!(
            "limit `{}`: a reserving limit refunds by its settle, not by a refund",
            a.policy.name
        )));
    }
    Ok(())
}

/// The limit script's call for a call's merged asks.
pub(super) struct LimitCall {
    /// The request id, the mode, each entry's values, then each entry's expiry offset.
    pub(super) cmd: redis::Cmd,
    /// One per entry: a policy's state, and after a reserving policy its index.
    pub(super) keys: Vec<String>,
    /// Per merged ask, its entry's place in the reply (a reserving policy's index entry, and
    /// so a settle's answer, is the next).
    pub(super) at: Vec<usize>,
}

impl LimitCall {
    /// Lay out the call for `asks` and their state `keys` (tagged by `tag`).
    pub(super) fn new(
        client: &Client,
        asks: &[Ask],
        keys: Vec<String>,
        tag: &str,
        peek: bool,
    ) -> LimitCall {
        let mut call = LimitCall {
            cmd: redis::Cmd::new(),
            keys: Vec::with_capacity(keys.len()),
            at: Vec::with_capacity(asks.len()),
        };
        call.cmd
            .arg(super::request_id())
            .arg(if peek { "peek" } else { "apply" });
        let mut offsets = Vec::with_capacity(asks.len());
        for (a, key) in asks.iter().zip(keys) {
            push_args(&mut call.cmd, a);
            call.at.push(call.keys.len());
            // The offset its window-aligned state key's expiry is spread by.
            offsets.push(a.policy.expiry_offset_ms(&key));
            call.keys.push(key);
            if a.reservation.is_some() {
                offsets.push(0);
                let index = Reservation::KINDS.1;
                let key = super::super::key(client.prefix(), index, &a.policy.name, a.subject, tag);
                call.keys.push(key);
            }
        }
        // Then per entry the offset its window-aligned state key's expiry is spread by.
        for off in offsets {
            call.cmd.arg(off);
        }
        call
    }
}

/// Push `a`'s values, and a reserving policy's index entry after them (`lua/reserve.lua`).
fn push_args(cmd: &mut redis::Cmd, a: &Ask) {
    let p = a.policy;
    let kind = AskKind::of(AskFlags {
        refund: a.refund,
        reserve: a.reservation.map(|r| r.phase == Phase::Reserve),
        quota: a.quota,
        shadow: p.shadow,
        usage: a.usage,
    });
    PolicyArgs {
        algorithm: p.algorithm.code(),
        limit: p.limit,
        window_ms: p.window_ms(),
        burst: p.burst.unwrap_or(p.limit),
        kind,
        cost: a.cost,
    }
    .push(cmd);
    if let Some(r) = &a.reservation {
        IndexArgs {
            expiry_ms: r.expiry.as_millis() as u64,
            max_extra: r.max_extra,
            id: r.id,
            kind,
        }
        .push(cmd);
    }
}

/// Read the script's `reply` (of `entries` entries, each merged ask's `at` its
/// [`LimitCall::at`]) for `asks` (merged as `merged`): the decision, and what each ask's settle
/// did.
pub(super) fn read_reply(
    reply: &redis::Value,
    entries: usize,
    at: &[usize],
    asks: &[Ask],
    merged: &MergedAsks,
    peek: bool,
) -> Result<(Decision, Vec<Option<Settled>>), RequestError> {
    let r = LimitReply::parse(reply, entries)?;
    let policies = asks
        .iter()
        .zip(&merged.slot_of)
        .map(|(a, &slot)| r.policies[at[slot]].verdict(a.policy))
        .collect();
    // A settle's answer is its index entry's; merged asks share it, so only the first tells.
    let mut told = vec![false; merged.asks.len()];
    let mut settled = Vec::with_capacity(asks.len());
    for (a, &slot) in asks.iter().zip(&merged.slot_of) {
        let is_settle = a.reservation.is_some_and(|r| r.phase == Phase::Settle);
        if !is_settle || peek || std::mem::replace(&mut told[slot], true) {
            settled.push(None);
            continue;
        }
        let s = Settled::from_reply(reply, at[slot] + 1).ok_or_else(|| RequestError::Reply {
            script: "limit",
            detail: format!("{reply:?}"),
        })?;
        settled.push(Some(s));
    }
    let decision = Decision {
        admitted: r.admitted,
        policies,
        without_redis: false,
        now_ms: r.now_ms,
    };
    Ok((decision, settled))
}
