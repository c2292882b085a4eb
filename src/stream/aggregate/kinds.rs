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

/// How to take one contribution back (an event whose later counter overflowed).
#[derive(Debug)]
pub(super) struct Undo {
    pub(super) shard: u32,
    pub(super) key: Box<[u8]>,
    pub(super) created_key: bool,
    pub(super) step: UndoStep,
}

#[derive(Debug)]
pub(super) enum UndoStep {
    Sub(i64),
    RemoveMember(Box<str>),
    SubScore(Box<str>, i64),
    Nothing,
}

/// Apply `c` to `map[key]`: `Err(())` when a sum would overflow (nothing changed). Returns the
/// number of new items (for `pending_keys`) and how to undo it. `expire_at_ms` is the window's
/// (unspread) expiry, `stored` turns it into the key's stored one (`model::stored_expire_at`),
/// hashed only for a new key or a later expiry.
pub(super) fn apply(
    map: &mut OtherMap,
    key: &[u8],
    c: &Contribution<'_>,
    expire_at_ms: i64,
    stored: impl Fn(i64) -> i64,
    hasher: &RandomState,
) -> Result<(usize, bool, UndoStep), ()> {
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
    let result = match (&mut entry.op, c) {
        (Op::HashAdd { delta, .. }, Contribution::HashAdd { delta: d, .. }) => {
            match delta.checked_add(*d) {
                Some(sum) => {
                    *delta = sum;
                    Ok((usize::from(created), UndoStep::Sub(*d)))
                }
                None => Err(()),
            }
        }
        (Op::Distinct { members, .. }, Contribution::Member { member, .. }) => {
            if members.insert((*member).into()) {
                Ok((1, UndoStep::RemoveMember((*member).into())))
            } else {
                Ok((0, UndoStep::Nothing))
            }
        }
        (Op::Scores(scores), Contribution::Score { member, delta }) => {
            match scores.get_mut(*member) {
                Some(s) => match s.checked_add(*delta) {
                    Some(sum) => {
                        *s = sum;
                        Ok((0, UndoStep::SubScore((*member).into(), *delta)))
                    }
                    None => Err(()),
                },
                None => {
                    scores.insert((*member).into(), *delta);
                    Ok((1, UndoStep::RemoveMember((*member).into())))
                }
            }
        }
        // One key always belongs to one counter, hence one kind (the overlap check).
        _ => Ok((0, UndoStep::Nothing)),
    };
    match result {
        Ok((items, step)) => Ok((items, created, step)),
        Err(()) => {
            if created {
                map.remove(key);
            }
            Err(())
        }
    }
}

/// Take back one contribution; returns how many items left `pending_keys`.
pub(super) fn undo(map: &mut OtherMap, u: &Undo) -> usize {
    let Some(entry) = map.get_mut(&u.key) else {
        return 0;
    };
    let mut removed = 0;
    match (&mut entry.op, &u.step) {
        (Op::HashAdd { delta, .. }, UndoStep::Sub(d)) => *delta -= d,
        (Op::Distinct { members, .. }, UndoStep::RemoveMember(m)) => {
            removed += usize::from(members.remove(m));
        }
        (Op::Scores(scores), UndoStep::RemoveMember(m)) => {
            removed += usize::from(scores.remove(m).is_some());
        }
        (Op::Scores(scores), UndoStep::SubScore(m, d)) => {
            if let Some(s) = scores.get_mut(m) {
                *s -= d;
            }
        }
        _ => {}
    }
    if u.created_key {
        map.remove(&u.key);
        // A hash field counts one item for its key.
        if matches!(u.step, UndoStep::Sub(_)) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contributions_merge_and_undo_exactly() {
        let hasher = RandomState::new();
        let mut map = OtherMap::with_hasher(hasher.clone());
        let score = |member, delta| Contribution::Score { member, delta };
        let (items, created, _) =
            apply(&mut map, b"k", &score("a", 5), 10, |at| at, &hasher).unwrap();
        assert_eq!((items, created), (1, true));
        let (items, _, step) = apply(&mut map, b"k", &score("a", 7), 20, |at| at, &hasher).unwrap();
        assert_eq!(items, 0, "same member: no new item");
        assert_eq!(map[&b"k"[..]].expire_at_ms, 20, "the later expiry wins");
        assert!(apply(&mut map, b"k", &score("a", i64::MAX), 20, |at| at, &hasher).is_err());
        let u = Undo {
            shard: 0,
            key: b"k".as_slice().into(),
            created_key: false,
            step,
        };
        assert_eq!(undo(&mut map, &u), 0);
        let Op::Scores(scores) = &map[&b"k"[..]].op else {
            panic!("scores")
        };
        assert_eq!(
            scores["a"], 5,
            "overflow left the sum alone; undo took 7 back"
        );

        let member = |m| Contribution::Member {
            exact: true,
            member: m,
        };
        let (items, created, step) =
            apply(&mut map, b"d", &member("x"), 10, |at| at, &hasher).unwrap();
        assert_eq!((items, created), (1, true));
        assert_eq!(
            apply(&mut map, b"d", &member("x"), 10, |at| at, &hasher)
                .unwrap()
                .0,
            0
        );
        let u = Undo {
            shard: 0,
            key: b"d".as_slice().into(),
            created_key: true,
            step,
        };
        assert_eq!(undo(&mut map, &u), 1);
        assert!(
            !map.contains_key(&b"d"[..]),
            "a key the event created goes with it"
        );
    }
}
