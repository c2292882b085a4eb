//! The write-ahead snapshot of a closing window: the answers its final records carry, written
//! to the window's published-values hash BEFORE anything is produced, so that every attempt
//! (a retry after a send timed out, a new leader after a kill) produces the same records byte
//! for byte, whatever late event landed in between.
//!
//! The hash holds record key → [`Cell::answer`], and `@snap` once the snapshot is complete.
//! Chunks are written only while `@snap` is absent: a publisher killed mid-snapshot produced
//! nothing yet, and the next attempt writes the snapshot again (over the partial one, and over
//! the values that `when = "updates"` recorded while the window was open). Once `@snap` is
//! set the hash is read back and that is what is produced: two publishers (a former leader
//! still finishing) that wrote chunks concurrently both produce what the hash froze.

use super::PublishError;
use std::collections::BTreeMap;

use tally_counters::conn::Conn;
use tally_counters::model::CounterSpec;
use tally_counters::window::Window;

use super::cells::Cell;
use super::record::Emit;

/// The hash's fields that are the publisher's state, not record keys (a record key has its
/// window's time in it, so it is never one of these, even when it starts with `@`).
const STATE: [&str; 3] = ["@snap", "@watermark", "@open"];

/// Cells per HSET of the snapshot (two arguments each: Lua's `unpack` takes at most ~8,000).
const CHUNK: usize = 2_000;

/// How long the published-values hash outlives the window's keys when the counter produces
/// tombstones: the time a publisher has to produce them from it (a publisher away longer than
/// this, past the window's expiry, finds nothing to produce them from).
pub const TOMBSTONE_GRACE_MS: i64 = 3_600_000;

/// When the published-values hash of `window` expires: with the last of its keys (window end +
/// retention + the counter's expiry spread; plus [`TOMBSTONE_GRACE_MS`] with tombstones). Every
/// write sets it again, so that a write after it passed does not leave a hash without expiry.
pub fn expire_at(spec: &CounterSpec, window: &Window) -> i64 {
    let tombstones = spec.output.as_ref().is_some_and(|o| o.tombstones);
    let grace = if tombstones { TOMBSTONE_GRACE_MS } else { 0 };
    spec.expire_at(window.end_ms)
        .saturating_add(spec.expiry_spread_ms)
        .saturating_add(grace)
}

/// A window's snapshot, as [`take`] found it.
#[derive(Debug)]
pub struct Taken {
    /// The cells to produce, sorted by record key.
    pub cells: Vec<Cell>,
    /// It was complete before this attempt: a re-publish.
    pub again: bool,
}

/// The snapshot of `window` recorded in `hash`: written from `cells` if the hash has none
/// complete, then read back.
pub async fn take(
    conn: &mut Conn,
    spec: &CounterSpec,
    window: &Window,
    hash: &str,
    cells: &[Cell],
) -> Result<Taken, PublishError> {
    let again: bool = conn
        .query(redis::cmd("HEXISTS").arg(hash).arg("@snap"))
        .await?;
    if !again {
        write(conn, hash, expire_at(spec, window), cells).await?;
    }
    let cells = read(conn, spec, hash).await?;
    Ok(Taken { cells, again })
}

/// Record `cells`' answers as published in `hash` (a correction, or with `open` an update of
/// an open window, that Kafka acknowledged; or in a window's dropped-changes hash, what
/// [`super::late`] dropped). An update never changes a snapshot (a former
/// leader's pass finishing after the window closed).
pub async fn record(
    conn: &mut Conn,
    spec: &CounterSpec,
    window: &Window,
    hash: &str,
    cells: &[Cell],
    open: bool,
) -> Result<(), PublishError> {
    let expire = expire_at(spec, window);
    for chunk in cells.chunks(CHUNK) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(
            "if ARGV[2] == '1' and redis.call('HEXISTS', KEYS[1], '@snap') == 1 then \
             return 0 end \
             redis.call('HSET', KEYS[1], unpack(ARGV, 3)) \
             redis.call('PEXPIREAT', KEYS[1], ARGV[1]) return 1",
        )
        .arg(1)
        .arg(hash)
        .arg(expire)
        .arg(u8::from(open));
        for c in chunk {
            cmd.arg(&c.key).arg(c.answer());
        }
        let _: i64 = conn.query(&cmd).await?;
    }
    Ok(())
}

/// Write `cells` into `hash` unless a snapshot is complete there, then mark it complete.
async fn write(
    conn: &mut Conn,
    hash: &str,
    expire: i64,
    cells: &[Cell],
) -> Result<(), PublishError> {
    for chunk in cells.chunks(CHUNK) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(
            "if redis.call('HEXISTS', KEYS[1], '@snap') == 1 then return 0 end \
             redis.call('HSET', KEYS[1], unpack(ARGV, 2)) \
             redis.call('PEXPIREAT', KEYS[1], ARGV[1]) return 1",
        )
        .arg(1)
        .arg(hash)
        .arg(expire);
        for c in chunk {
            cmd.arg(&c.key).arg(c.answer());
        }
        let written: i64 = conn.query(&cmd).await?;
        if written == 0 {
            // Another publisher completed it: that one is the snapshot.
            return Ok(());
        }
    }
    let mut done = redis::cmd("EVAL");
    done.arg(
        "redis.call('HSETNX', KEYS[1], '@snap', 1) \
         redis.call('PEXPIREAT', KEYS[1], ARGV[1]) return 1",
    )
    .arg(1)
    .arg(hash)
    .arg(expire);
    let _: i64 = conn.query(&done).await?;
    Ok(())
}

/// The snapshot in `hash` (HSCAN, so that a large window does not block Redis), its
/// [`STATE`] fields left out.
async fn read(conn: &mut Conn, spec: &CounterSpec, hash: &str) -> Result<Vec<Cell>, PublishError> {
    let fields = answers(conn, hash).await?;
    Ok(fields
        .into_iter()
        .filter_map(|(key, text)| {
            let (dims, _) = spec.template.decode(key.as_bytes())?;
            Cell::from_answer(key, dims, &text)
        })
        .collect())
}

/// Every record key of `hash` and the answer it records (HSCAN), [`STATE`] left out.
pub async fn answers(
    conn: &mut Conn,
    hash: &str,
) -> Result<BTreeMap<String, String>, PublishError> {
    let mut fields = BTreeMap::new();
    let mut cursor: u64 = 0;
    loop {
        let mut scan = redis::cmd("HSCAN");
        scan.arg(hash).arg(cursor).arg("COUNT").arg(1000);
        let (next, page): (u64, Vec<(String, String)>) = conn.query(&scan).await?;
        // HSCAN may return a field twice (a rehash in between): the map keeps one.
        fields.extend(
            page.into_iter()
                .filter(|(k, _)| !STATE.contains(&k.as_str())),
        );
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(fields)
}

/// The cells of `now` whose answer differs from the one `snapshot` recorded, or that it lacks:
/// the corrections due right after a final publish.
pub fn changed_since(snapshot: &[Cell], now: Vec<Cell>) -> Vec<Cell> {
    let had: BTreeMap<&str, String> = snapshot
        .iter()
        .map(|c| (c.key.as_str(), c.answer()))
        .collect();
    now.into_iter()
        .filter(|c| had.get(c.key.as_str()) != Some(&c.answer()))
        .collect()
}

/// Create the window's published-values `hash` (with its expiry) and return the watermark
/// its records carry. A closed window's is the one of its first final attempt, so that a
/// re-publish is byte for byte the same. Updates of an open window carry the watermark of
/// their pass and leave `@watermark` to the close.
pub async fn start(
    conn: &mut Conn,
    spec: &CounterSpec,
    window: &Window,
    hash: &str,
    wm: i64,
    how: Emit,
) -> Result<i64, PublishError> {
    let mut first = redis::cmd("EVAL");
    first
        .arg(
            "local closing = ARGV[3] == '1' \
             redis.call('HSETNX', KEYS[1], closing and '@watermark' or '@open', ARGV[1]) \
             redis.call('PEXPIREAT', KEYS[1], ARGV[2]) \
             if closing then return redis.call('HGET', KEYS[1], '@watermark') end \
             return ARGV[1]",
        )
        .arg(1)
        .arg(hash)
        .arg(wm)
        .arg(expire_at(spec, window))
        .arg(u8::from(how != Emit::Update));
    Ok(conn.query(&first).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(key: &str, value: i64, top: Option<Vec<(&str, i64)>>) -> Cell {
        Cell {
            key: key.into(),
            dims: vec![key.into()],
            value,
            top: top.map(|t| t.into_iter().map(|(m, s)| (m.into(), s)).collect()),
        }
    }

    #[test]
    fn an_answer_reads_back_as_the_cell_it_was_written_from() {
        for c in [
            cell("a", 7, None),
            cell("b", -3, None),
            cell("c", 2, Some(vec![("d1", 9), ("d:0", 9)])),
            cell("d", 0, Some(vec![])),
        ] {
            let back = Cell::from_answer(c.key.clone(), c.dims.clone(), &c.answer());
            assert_eq!(back, Some(c.clone()), "{}", c.answer());
        }
        assert_eq!(Cell::from_answer("k".into(), vec![], "not an answer"), None);
    }

    #[test]
    fn the_corrections_after_a_snapshot_are_the_changed_and_the_new_keys() {
        let snap = [
            cell("a", 1, None),
            cell("b", 2, None),
            cell("t", 2, Some(vec![("x", 3), ("y", 1)])),
        ];
        let now = vec![
            cell("a", 1, None),
            cell("b", 3, None),
            cell("c", 1, None),
            // Same number of members, another ranking: a change.
            cell("t", 2, Some(vec![("y", 4), ("x", 3)])),
        ];
        let keys: Vec<String> = changed_since(&snap, now)
            .into_iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(keys, ["b", "c", "t"]);
    }
}
