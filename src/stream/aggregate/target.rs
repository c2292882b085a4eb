//! Where one counter puts one event: its window, its rendered (and, in a cluster, tagged) key,
//! its shard and its delta. Shared by `Aggregator::add` and by the check before it applies
//! (`check.rs`), which must find the same key.

use super::{Counter, HotKind};
use crate::model::layout::{series_shard, Layout};
use crate::stream::decode::Event;

/// Where one counter puts one event: `key_buf` holds the key (for hash storage, the hash's
/// key followed by the field, which starts at `split`).
pub(super) struct Target<'e> {
    pub(super) shard: u32,
    pub(super) delta: i64,
    pub(super) expire_at_ms: i64,
    pub(super) split: u32,
    /// Distinct and leaderboard: the member's value.
    pub(super) member: Option<&'e str>,
}

/// Where keys are rendered, and how they are spread.
pub(super) struct Render {
    /// The last rendered key (reused: no allocation per event).
    pub(super) buf: Vec<u8>,
    /// Shards keys are spread over (1 on standalone Redis).
    pub(super) shards: u32,
    /// Cluster key layout: appends each key's shard hash tag. None: plain keys.
    pub(super) layout: Option<Layout>,
}

/// Render `counter`'s key for `event` into `render.buf`; None when the window (plus retention)
/// has already expired at `now_ms`.
pub(super) fn target<'e>(
    counter: &mut Counter,
    event: &'e Event<'_>,
    now_ms: i64,
    render: &mut Render,
) -> Option<Target<'e>> {
    let (key_buf, shards, layout) = (&mut render.buf, render.shards, render.layout.as_ref());
    let window = *counter.windows.get(event.ts_ms);
    let expire_at_ms = crate::model::expire_at(window.end_ms, counter.retention_ms);
    if expire_at_ms <= now_ms {
        return None;
    }
    if counter.time_window != Some(window.start_ms) {
        counter
            .template
            .format_time(window.local_start, &mut counter.time_text);
        if let HotKind::Hash {
            template,
            time_text,
        } = &mut counter.kind
        {
            template.format_time(window.local_start, time_text);
        }
        counter.time_window = Some(window.start_ms);
    }
    let mut values: smallvec::SmallVec<[&str; 4]> = smallvec::SmallVec::new();
    values.extend(counter.dims.iter().map(|&i| &*event.dims[i]));
    counter
        .template
        .render(key_buf, &values, &counter.time_text);
    let shard = series_shard(&counter.name, &values, shards);
    let mut split = 0;
    let mut member = None;
    match &counter.kind {
        HotKind::Count => {}
        HotKind::Hash {
            template,
            time_text,
        } => {
            key_buf.clear();
            template.render(key_buf, &[], time_text);
            if let Some(layout) = layout {
                layout.append_tag(key_buf, shard);
            }
            split = key_buf.len() as u32;
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    key_buf.push(b':');
                }
                crate::key::escape_into(key_buf, v);
            }
            return Some(Target {
                shard,
                delta: counter.value.map_or(1, |i| event.nums[i]),
                expire_at_ms,
                split,
                member,
            });
        }
        HotKind::Distinct { member: m, .. } | HotKind::Leaderboard { member: m } => {
            member = Some(&*event.dims[*m]);
        }
    }
    if let Some(layout) = layout {
        layout.append_tag(key_buf, shard);
    }
    Some(Target {
        shard,
        delta: counter.value.map_or(1, |i| event.nums[i]),
        expire_at_ms,
        split,
        member,
    })
}
