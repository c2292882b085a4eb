//! Taking an event back: when one counter's pending sum would overflow, what the counters before
//! it added for the same event is undone, so the event is counted by every counter or by none.

use super::target::target;
use super::{kinds, Aggregator};
use crate::stream::decode::Event;

impl Aggregator {
    /// Take back what counters `0..created.len()` added for `event` (newest first, so two
    /// counters sharing a key unwind in order).
    pub(super) fn undo(
        &mut self,
        partition: i32,
        offset: i64,
        event: &Event<'_>,
        now_ms: i64,
        created: &[bool],
    ) {
        let part = self
            .partitions
            .get_mut(&partition)
            .expect("undo follows add");
        let skips = event.skips.all();
        for ci in (0..created.len()).rev() {
            if skips.checked_shr(ci as u32).unwrap_or(0) & 1 == 1 {
                continue;
            }
            let counter = &mut self.counters[ci];
            if !counter.is_count() {
                // Taken back from the undo log; only the statistics are settled here.
                if let Some(t) = target(
                    counter,
                    event,
                    now_ms,
                    &mut self.key_buf,
                    self.shards,
                    self.layout.as_ref(),
                ) {
                    if offset >= part.shards[t.shard as usize].open.start {
                        self.stats.counted[ci] -= 1;
                    } else {
                        self.stats.replay_skipped -= 1;
                    }
                } else {
                    self.stats.late[ci] -= 1;
                }
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
                self.stats.late[ci] -= 1;
                continue;
            };
            let state = &mut part.shards[target.shard as usize];
            if offset < state.open.start {
                self.stats.replay_skipped -= 1;
                continue;
            }
            self.stats.counted[ci] -= 1;
            if created[ci] {
                state.open.keys.remove(self.key_buf.as_slice());
                self.pending_keys -= 1;
            } else if let Some(d) = state.open.keys.get_mut(self.key_buf.as_slice()) {
                d.delta -= target.delta;
            }
        }
    }

    /// Take back the non-count contributions in `log` (newest first).
    pub(super) fn undo_other(&mut self, partition: i32, log: &[kinds::Undo]) {
        let Some(part) = self.partitions.get_mut(&partition) else {
            return;
        };
        for u in log.iter().rev() {
            let open = &mut part.shards[u.shard as usize].open;
            let removed = kinds::undo(&mut open.other, u);
            open.other_items -= removed;
            self.pending_keys -= removed;
        }
    }
}
