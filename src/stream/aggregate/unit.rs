//! A flush unit: [`FlushUnit`], sealed and sent, and the open unit of one (partition, shard) that
//! events are added to ([`OpenUnit`]) until it is sealed.

use ahash::RandomState;

use super::counter::Counter;
use super::keys::{KeyTable, Keys, MAX_KEY_BYTES};
use super::kinds::{self, Other, OtherMap};
use super::target::Target;
use crate::model::stored_expire_at;

/// A key's pending change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    /// Sum to add with INCRBY.
    pub delta: i64,
    /// The key's stored expiry, Unix ms: window end + retention, spread by the key's hash
    /// (`model::stored_expire_at`).
    pub expire_at_ms: i64,
}

/// The atomic flush unit: all contributions of offsets `[start, end)` of a partition to a shard.
#[derive(Debug)]
pub struct FlushUnit {
    /// Kafka partition.
    pub partition: i32,
    /// Shard within the partition (0 on standalone Redis).
    pub shard: u32,
    /// First offset covered; Redis must have applied exactly up to here.
    pub start: i64,
    /// One past the last offset covered; Redis records it once the unit is applied.
    pub end: i64,
    /// Keys and their deltas (possibly none: the unit then only advances the applied offset).
    pub keys: Keys,
    /// Changes of the other kinds (hash fields, distinct members, leaderboard scores).
    pub other: Vec<(Box<[u8]>, Other)>,
    /// The highest event time the partition has shown up to `end`, recorded with the applied
    /// offset (the partition's watermark before lateness); `i64::MIN` when no event was seen yet,
    /// None when no counter has an output (the script then records nothing).
    pub max_event_ms: Option<i64>,
}

impl FlushUnit {
    /// Entries the unit writes: keys, plus each hash field, member and score.
    pub fn items(&self) -> usize {
        self.keys.len() + self.other.iter().map(|(_, o)| o.items()).sum::<usize>()
    }
}

/// The unit of one (partition, shard) that events are added to, until it is sealed.
pub(super) struct OpenUnit {
    /// First offset it covers: Redis has applied its shard up to here, or the last unit ends here.
    pub(super) start: i64,
    /// Pending counts by key.
    pub(super) keys: KeyTable,
    /// Pending changes of the other kinds by key.
    pub(super) other: OtherMap,
    /// Items in `other` (see [`Other::items`]).
    pub(super) other_items: usize,
}

impl OpenUnit {
    pub(super) fn new(start: i64, hasher: &RandomState) -> OpenUnit {
        OpenUnit {
            start,
            keys: KeyTable::new(hasher),
            other: OtherMap::with_hasher(hasher.clone()),
            other_items: 0,
        }
    }

    pub(super) fn items(&self) -> usize {
        self.keys.len() + self.other_items
    }

    /// Whether the unit must be cut after this message: `max_keys` entries, or so many key
    /// bytes that the arena's offsets would no longer fit.
    pub(super) fn full(&self, max_keys: usize) -> bool {
        self.items() >= max_keys || self.keys.bytes_len() >= MAX_KEY_BYTES
    }

    /// Whether `counter`'s contribution for `target` to `key` can be added: no pending sum
    /// would overflow i64. Nothing is changed; [`OpenUnit::add`] then cannot fail.
    pub(super) fn fits(&self, counter: &Counter, key: &[u8], target: &Target<'_>) -> bool {
        if counter.is_count() {
            return self
                .keys
                .get(key)
                .is_none_or(|d| d.delta.checked_add(target.delta).is_some());
        }
        kinds::fits(&self.other, key, &kinds::contribution(counter, target))
    }

    /// Add `counter`'s contribution for `target` to `key` (checked with [`OpenUnit::fits`]
    /// where a sum could overflow); returns the items it added (for `pending_keys`).
    #[inline]
    pub(super) fn add(
        &mut self,
        counter: &Counter,
        key: &[u8],
        target: &Target<'_>,
        hasher: &RandomState,
    ) -> usize {
        if counter.is_count() {
            return usize::from(self.add_count(key, target, counter.expiry_spread_ms));
        }
        let c = kinds::contribution(counter, target);
        self.add_other(key, &c, target, counter.expiry_spread_ms, hasher)
    }

    /// Add a count contribution to `key` (the rendered key of `target`); returns whether it
    /// created the key. The key's stored expiry is its window's spread by `spread_ms`, hashed
    /// when the unit first sees the key (later contributions of the same window keep it).
    #[inline]
    fn add_count(&mut self, key: &[u8], target: &Target<'_>, spread_ms: i64) -> bool {
        let (d, created) = self.keys.get_or_insert_with(key, || Delta {
            delta: 0,
            expire_at_ms: stored_expire_at(key, target.expire_at_ms, spread_ms),
        });
        d.delta += target.delta;
        // A later window under the same key text (a local-time fold): the later expiry wins.
        if !created && target.expire_at_ms > d.expire_at_ms {
            d.expire_at_ms = stored_expire_at(key, target.expire_at_ms, spread_ms);
        }
        created
    }

    /// Add the contribution `c` of a non-count kind to `key`; returns the new items.
    #[inline]
    fn add_other(
        &mut self,
        key: &[u8],
        c: &kinds::Contribution<'_>,
        target: &Target<'_>,
        spread_ms: i64,
        hasher: &RandomState,
    ) -> usize {
        // A hash's fields share its key (before `split`), and so its expiry.
        let written = match target.split {
            0 => key,
            split => &key[..split as usize],
        };
        let stored = |at| stored_expire_at(written, at, spread_ms);
        let items = kinds::apply(&mut self.other, key, c, target.expire_at_ms, stored, hasher);
        self.other_items += items;
        items
    }
}

/// One shard of a partition: the unit events are added to, and those cut before it.
pub(super) struct ShardState {
    /// The unit events are added to.
    pub(super) open: OpenUnit,
    /// Units cut because they reached `max_keys_per_call`, oldest first.
    pub(super) sealed: Vec<FlushUnit>,
}

impl ShardState {
    /// Cut the open unit at `end` into a [`FlushUnit`] of `partition`'s `shard` (carrying the
    /// partition's highest event time where watermarks are on); the next unit starts at `end`.
    pub(super) fn seal(
        &mut self,
        partition: i32,
        shard: u32,
        end: i64,
        max_event_ms: Option<i64>,
        hasher: &RandomState,
    ) -> FlushUnit {
        // The next unit likely sees as many keys: `take` sizes its buffers up front.
        let keys = self.open.keys.take();
        let other = std::mem::replace(&mut self.open.other, OtherMap::with_hasher(hasher.clone()));
        self.open.other_items = 0;
        let unit = FlushUnit {
            partition,
            shard,
            start: self.open.start,
            end,
            keys,
            other: other.into_iter().collect(),
            max_event_ms,
        };
        self.open.start = end;
        unit
    }
}
