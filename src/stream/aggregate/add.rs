//! Adding one event: each counter renders its key and adds its contribution to the open unit of
//! the key's shard. The event is added to every counter or to none: should one counter's sum
//! overflow, what the counters before it added is taken back (`undo.rs`).

use ahash::RandomState;
use smallvec::SmallVec;

use super::target::{target, Target};
use super::{kinds, seal, Added, Aggregator, Counter, Delta, OpenUnit};
use crate::model::stored_expire_at;
use crate::stream::decode::Event;

/// What [`Aggregator::add`] records while it adds one event, to finish the event or take it
/// back.
#[derive(Default)]
struct Trail {
    /// Shards whose open unit reached `max_keys_per_call`, cut once the whole event is in.
    full: SmallVec<[u32; 4]>,
    /// Whether counter i created its key for this event (undone on overflow).
    created: SmallVec<[bool; 8]>,
    /// How to take back what the non-count kinds added, should a later counter overflow.
    undo_log: SmallVec<[kinds::Undo; 2]>,
}

/// A pending sum would overflow i64 (nothing of that contribution was added).
struct Overflow;

impl Trail {
    /// Add counter `ci`'s contribution for `target` to `key` in `open`, noting how to take it
    /// back; returns the items it added (for `pending_keys`).
    #[inline]
    fn record(
        &mut self,
        ci: usize,
        counter: &Counter,
        open: &mut OpenUnit,
        key: &[u8],
        target: &Target<'_>,
        hasher: &RandomState,
    ) -> Result<usize, Overflow> {
        if counter.is_count() {
            let created = add_count(open, key, target, counter.expiry_spread_ms)?;
            if created {
                self.created[ci] = true;
            }
            return Ok(usize::from(created));
        }
        let c = kinds::contribution(counter, target);
        let (items, undo) = add_other(open, key, &c, target, counter.expiry_spread_ms, hasher)?;
        self.undo_log.push(undo);
        Ok(items)
    }
}

impl Aggregator {
    /// Add one event at `offset` of `partition`. `now_ms` decides lateness.
    ///
    /// The event is added to every counter or to none: if one counter's pending sum would
    /// overflow i64, what the event added to the counters before it is taken back and the
    /// caller treats the message as bad input.
    pub fn add(&mut self, partition: i32, offset: i64, event: &Event<'_>, now_ms: i64) -> Added {
        let Some(part) = self.partitions.get_mut(&partition) else {
            return Added::Ignored;
        };
        if offset < part.position {
            return Added::Ignored;
        }
        part.position = offset + 1;
        part.max_event_ms = part.max_event_ms.max(event.ts_ms);
        let mut trail = Trail::default();
        let mut overflow_at = None;
        let skips = event.skips.all();
        for (ci, counter) in self.counters.iter_mut().enumerate() {
            trail.created.push(false);
            if skips.checked_shr(ci as u32).unwrap_or(0) & 1 == 1 {
                continue;
            }
            let Some(target) = target(
                counter,
                event,
                now_ms,
                &mut self.key_buf,
                self.shards,
                self.layout.as_ref(),
            ) else {
                self.stats.late[ci] += 1;
                continue;
            };
            let state = &mut part.shards[target.shard as usize];
            if offset < state.open.start {
                self.stats.replay_skipped += 1;
                continue;
            }
            let added = trail.record(
                ci,
                counter,
                &mut state.open,
                &self.key_buf,
                &target,
                &self.hasher,
            );
            let Ok(items) = added else {
                overflow_at = Some(ci);
                break;
            };
            if items > 0 {
                self.pending_keys += items;
                if state.open.full(self.max_keys_per_call) && !trail.full.contains(&target.shard) {
                    trail.full.push(target.shard);
                }
            }
            self.stats.counted[ci] += 1;
        }
        if let Some(stop) = overflow_at {
            self.undo(partition, offset, event, now_ms, &trail.created[..stop]);
            self.undo_other(partition, &trail.undo_log);
            return Added::Overflow;
        }
        self.seal_full(partition, offset + 1, &trail.full);
        Added::Counted
    }

    /// Cut the open units of `full` shards of `partition` at `end`, after the whole message:
    /// a unit always ends on a message boundary.
    #[inline]
    fn seal_full(&mut self, partition: i32, end: i64, full: &[u32]) {
        let part = self
            .partitions
            .get_mut(&partition)
            .expect("partition checked above");
        let seen = self.watermarks.then_some(part.max_event_ms);
        for &shard in full {
            let state = &mut part.shards[shard as usize];
            let unit = seal::seal_unit(partition, shard, state, end, seen, &self.hasher);
            state.sealed.push(unit);
        }
    }
}

/// Add a count contribution to `key` (the rendered key of `target`) in `open`; returns whether
/// it created the key. The key's stored expiry is its window's spread by `spread_ms`, hashed
/// when the unit first sees the key (later contributions of the same window keep it).
#[inline]
fn add_count(
    open: &mut OpenUnit,
    key: &[u8],
    target: &Target<'_>,
    spread_ms: i64,
) -> Result<bool, Overflow> {
    if let Some(d) = open.keys.get_mut(key) {
        d.delta = d.delta.checked_add(target.delta).ok_or(Overflow)?;
        // A later window under the same key text (a local-time fold): the later expiry wins.
        if target.expire_at_ms > d.expire_at_ms {
            d.expire_at_ms = stored_expire_at(key, target.expire_at_ms, spread_ms);
        }
        return Ok(false);
    }
    open.keys.insert_new(
        key,
        Delta {
            delta: target.delta,
            expire_at_ms: stored_expire_at(key, target.expire_at_ms, spread_ms),
        },
    );
    Ok(true)
}

/// Add the contribution `c` of a non-count kind to `key` in `open`; returns the new items and
/// how to take the contribution back.
#[inline]
fn add_other(
    open: &mut OpenUnit,
    key: &[u8],
    c: &kinds::Contribution<'_>,
    target: &Target<'_>,
    spread_ms: i64,
    hasher: &RandomState,
) -> Result<(usize, kinds::Undo), Overflow> {
    // A hash's fields share its key (before `split`), and so its expiry.
    let written = match target.split {
        0 => key,
        split => &key[..split as usize],
    };
    let stored = |at| stored_expire_at(written, at, spread_ms);
    let (items, created_key, step) =
        kinds::apply(&mut open.other, key, c, target.expire_at_ms, stored, hasher)
            .map_err(|()| Overflow)?;
    open.other_items += items;
    let undo = kinds::Undo {
        shard: target.shard,
        key: key.into(),
        created_key,
        step,
    };
    Ok((items, undo))
}
