//! Where one counter puts one event: its window, its rendered (and, in a cluster, tagged) key,
//! its shard and its delta. Shared by `add` and by `undo`, which must find the same key again.

use super::Counter;
use crate::decode::Event;
use crate::model::layout::{shard_of, Layout};

/// Where one counter puts one event: `key_buf` holds the key.
pub(super) struct Target {
    pub(super) shard: u32,
    pub(super) delta: i64,
    pub(super) expire_at_ms: i64,
}

/// Render `counter`'s key for `event` into `key_buf`; None when the window (plus retention)
/// has already expired at `now_ms`.
pub(super) fn target(
    counter: &mut Counter,
    event: &Event<'_>,
    now_ms: i64,
    key_buf: &mut Vec<u8>,
    shards: u32,
    layout: Option<&Layout>,
) -> Option<Target> {
    let window = *counter.windows.get(event.ts_ms);
    let expire_at_ms = crate::model::expire_at(window.end_ms, counter.retention_ms);
    if expire_at_ms <= now_ms {
        return None;
    }
    if counter.time_window != Some(window.start_ms) {
        counter
            .template
            .format_time(window.local_start, &mut counter.time_text);
        counter.time_window = Some(window.start_ms);
    }
    let mut values: smallvec::SmallVec<[&str; 4]> = smallvec::SmallVec::new();
    values.extend(counter.dims.iter().map(|&i| &*event.dims[i]));
    counter
        .template
        .render(key_buf, &values, &counter.time_text);
    let shard = shard_of(key_buf, shards);
    if let Some(layout) = layout {
        layout.append_tag(key_buf, shard);
    }
    Some(Target {
        shard,
        delta: counter.value.map_or(1, |i| event.nums[i]),
        expire_at_ms,
    })
}
