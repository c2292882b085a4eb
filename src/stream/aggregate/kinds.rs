//! Pending changes of the counter kinds that are not a plain INCRBY: counts kept in a hash
//! field (HINCRBY), distinct values (PFADD / SADD) and leaderboards (ZINCRBY). They are
//! pre-aggregated per key like counts (members deduplicated, scores summed) and travel in the
//! same unit, so they are applied under the same fence: a replay never adds a score twice.

use std::collections::{HashMap, HashSet};

use ahash::RandomState;

/// What is pending for one key of a non-count kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// HINCRBY: the pending key is the hash's key followed by the field; `split` is where the
    /// field starts.
    HashAdd {
        /// Length of the hash's key within the pending key.
        split: u32,
        /// Sum to add.
        delta: i64,
    },
    /// PFADD (HyperLogLog) or SADD (`exact`) of these members.
    Distinct {
        /// A set instead of a HyperLogLog.
        exact: bool,
        /// Members seen since the last flush, deduplicated.
        members: HashSet<Box<str>, RandomState>,
    },
    /// ZINCRBY of each member by its summed score.
    Scores(HashMap<Box<str>, i64, RandomState>),
}

/// A pending change and its key's absolute expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Other {
    /// The change.
    pub op: Op,
    /// Absolute expiry (window end + retention), Unix ms.
    pub expire_at_ms: i64,
}

impl Other {
    /// Entries this change sends to Redis (members and scores count one each): what bounds a
    /// unit's size like keys do.
    pub fn items(&self) -> usize {
        match &self.op {
            Op::HashAdd { .. } => 1,
            Op::Distinct { members, .. } => members.len(),
            Op::Scores(scores) => scores.len(),
        }
    }
}

pub(super) type OtherMap = HashMap<Box<[u8]>, Other, RandomState>;

/// One contribution of an event to a non-count key.
pub(super) enum Contribution<'a> {
    /// Add `delta` to the field starting at `split` of the pending key.
    HashAdd { split: u32, delta: i64 },
    /// Add `member` to a distinct set.
    Member { exact: bool, member: &'a str },
    /// Add `delta` to `member`'s score.
    Score { member: &'a str, delta: i64 },
}

/// What `counter` (not a count) adds for `target`.
pub(super) fn contribution<'a>(
    counter: &super::Counter,
    target: &super::target::Target<'a>,
) -> Contribution<'a> {
    use super::HotKind;
    match &counter.kind {
        HotKind::Distinct { exact, .. } => Contribution::Member {
            exact: *exact,
            member: target.member.unwrap_or_default(),
        },
        HotKind::Leaderboard { .. } => Contribution::Score {
            member: target.member.unwrap_or_default(),
            delta: target.delta,
        },
        _ => Contribution::HashAdd {
            split: target.split,
            delta: target.delta,
        },
    }
}

/// Whether `c` can be added to `map[key]`: no sum would overflow i64 (a new key or member
/// starts from zero, which always fits).
pub(super) fn fits(map: &OtherMap, key: &[u8], c: &Contribution<'_>) -> bool {
    let Some(entry) = map.get(key) else {
        return true;
    };
    match (&entry.op, c) {
        (Op::HashAdd { delta, .. }, Contribution::HashAdd { delta: d, .. }) => {
            delta.checked_add(*d).is_some()
        }
        (Op::Scores(scores), Contribution::Score { member, delta }) => scores
            .get(*member)
            .is_none_or(|s| s.checked_add(*delta).is_some()),
        _ => true,
    }
}

/// Apply `c` to `map[key]`, which [`fits`] (checked by the caller where a sum could overflow);
/// returns the number of new items (for `pending_keys`). `expire_at_ms` is the window's
/// (unspread) expiry, `stored` turns it into the key's stored one (`model::stored_expire_at`),
/// hashed only for a new key or a later expiry.
pub(super) fn apply(
    map: &mut OtherMap,
    key: &[u8],
    c: &Contribution<'_>,
    expire_at_ms: i64,
    stored: impl Fn(i64) -> i64,
    hasher: &RandomState,
) -> usize {
    let created = !map.contains_key(key);
    if created {
        let expire_at_ms = stored(expire_at_ms);
        let op = match c {
            Contribution::HashAdd { split, .. } => Op::HashAdd {
                split: *split,
                delta: 0,
            },
            Contribution::Member { exact, .. } => Op::Distinct {
                exact: *exact,
                members: HashSet::with_hasher(hasher.clone()),
            },
            Contribution::Score { .. } => Op::Scores(HashMap::with_hasher(hasher.clone())),
        };
        map.insert(key.into(), Other { op, expire_at_ms });
    }
    let entry = map.get_mut(key).expect("inserted above");
    if !created && expire_at_ms > entry.expire_at_ms {
        entry.expire_at_ms = stored(expire_at_ms);
    }
    match (&mut entry.op, c) {
        (Op::HashAdd { delta, .. }, Contribution::HashAdd { delta: d, .. }) => {
            *delta += d;
            usize::from(created)
        }
        (Op::Distinct { members, .. }, Contribution::Member { member, .. }) => {
            usize::from(members.insert((*member).into()))
        }
        (Op::Scores(scores), Contribution::Score { member, delta }) => {
            match scores.get_mut(*member) {
                Some(s) => {
                    *s += delta;
                    0
                }
                None => {
                    scores.insert((*member).into(), *delta);
                    1
                }
            }
        }
        // One key always belongs to one counter, hence one kind (the overlap check).
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contributions_merge_and_are_checked_before_they_apply() {
        let hasher = RandomState::new();
        let mut map = OtherMap::with_hasher(hasher.clone());
        let score = |member, delta| Contribution::Score { member, delta };
        assert!(fits(&map, b"k", &score("a", i64::MAX)), "a new key fits");
        assert_eq!(
            apply(&mut map, b"k", &score("a", 5), 10, |at| at, &hasher),
            1
        );
        assert_eq!(
            apply(&mut map, b"k", &score("a", 7), 20, |at| at, &hasher),
            0,
            "same member: no new item"
        );
        assert_eq!(map[&b"k"[..]].expire_at_ms, 20, "the later expiry wins");
        assert!(
            !fits(&map, b"k", &score("a", i64::MAX)),
            "12 + MAX overflows"
        );
        assert!(
            fits(&map, b"k", &score("b", i64::MAX)),
            "another member starts at 0"
        );
        let Op::Scores(scores) = &map[&b"k"[..]].op else {
            panic!("scores")
        };
        assert_eq!(scores["a"], 12);

        let field = |delta| Contribution::HashAdd { split: 1, delta };
        assert_eq!(
            apply(&mut map, b"hf", &field(i64::MIN), 10, |at| at, &hasher),
            1
        );
        assert!(!fits(&map, b"hf", &field(-1)));
        assert!(fits(&map, b"hf", &field(i64::MAX)));

        let member = |m| Contribution::Member {
            exact: true,
            member: m,
        };
        assert_eq!(apply(&mut map, b"d", &member("x"), 10, |at| at, &hasher), 1);
        assert_eq!(apply(&mut map, b"d", &member("x"), 10, |at| at, &hasher), 0);
        assert!(fits(&map, b"d", &member("y")), "members never overflow");
    }
}
