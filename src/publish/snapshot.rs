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

use std::collections::BTreeMap;

use tally_counters::conn::Conn;
use tally_counters::model::CounterSpec;

use super::cells::Cell;

/// Cells per HSET of the snapshot (two arguments each: Lua's `unpack` takes at most ~8,000).
const CHUNK: usize = 2_000;

/// The snapshot of the window recorded in `hash`: written from `cells` if the hash has none
/// complete, then read back. Sorted by record key.
pub async fn take(
    conn: &mut Conn,
    spec: &CounterSpec,
    hash: &str,
    cells: &[Cell],
) -> anyhow::Result<Vec<Cell>> {
    let done: bool = conn
        .query(redis::cmd("HEXISTS").arg(hash).arg("@snap"))
        .await?;
    if !done {
        write(conn, hash, cells).await?;
    }
    read(conn, spec, hash).await
}

/// Write `cells` into `hash` unless a snapshot is complete there, then mark it complete.
async fn write(conn: &mut Conn, hash: &str, cells: &[Cell]) -> anyhow::Result<()> {
    for chunk in cells.chunks(CHUNK) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(
            "if redis.call('HEXISTS', KEYS[1], '@snap') == 1 then return 0 end \
             redis.call('HSET', KEYS[1], unpack(ARGV)) return 1",
        )
        .arg(1)
        .arg(hash);
        for c in chunk {
            cmd.arg(&c.key).arg(c.answer());
        }
        let written: i64 = conn.query(&cmd).await?;
        if written == 0 {
            // Another publisher completed it: that one is the snapshot.
            return Ok(());
        }
    }
    let _: i64 = conn
        .query(redis::cmd("HSETNX").arg(hash).arg("@snap").arg(1))
        .await?;
    Ok(())
}

/// The snapshot in `hash` (HSCAN, so that a large window does not block Redis), its `@`
/// fields (state, not keys) left out.
async fn read(conn: &mut Conn, spec: &CounterSpec, hash: &str) -> anyhow::Result<Vec<Cell>> {
    let mut fields = BTreeMap::new();
    let mut cursor: u64 = 0;
    loop {
        let mut scan = redis::cmd("HSCAN");
        scan.arg(hash).arg(cursor).arg("COUNT").arg(1000);
        let (next, page): (u64, Vec<(String, String)>) = conn.query(&scan).await?;
        // HSCAN may return a field twice (a rehash in between): the map keeps one.
        fields.extend(page.into_iter().filter(|(k, _)| !k.starts_with('@')));
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(fields
        .into_iter()
        .filter_map(|(key, text)| {
            let (dims, _) = spec.template.decode(key.as_bytes())?;
            Cell::from_answer(key, dims, &text)
        })
        .collect())
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
