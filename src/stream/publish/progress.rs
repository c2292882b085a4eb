//! A counter's publishing progress: the end of the last window published, kept in Redis (one
//! key per counter), and how far behind the watermark it is.
//!
//! Behind is measured from the oldest window that should have been published and was not: the
//! event time between its end and the counter's watermark. It grows from the first closable
//! window on, whatever keeps the publisher from producing it (a topic that cannot be created or
//! written, Kafka down, nothing ever published yet), and is 0 once every closed window is out.

use super::PublishError;
use tally_counters::conn::Conn;

/// The end of the last window published for the counter of `key` (None: none ever was).
pub async fn read(conn: &mut Conn, key: &str) -> Result<Option<i64>, PublishError> {
    Ok(conn.query(redis::cmd("GET").arg(key)).await?)
}

/// Raise the progress `key` to `end` (never lower it: a replica that lost the leadership and
/// still finishes a window cannot move it back).
pub async fn advance(conn: &mut Conn, key: &str, end: i64) -> Result<(), PublishError> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(
        "local have = tonumber(redis.call('GET', KEYS[1])) \
         if have == nil or have < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end \
         return 1",
    )
    .arg(1)
    .arg(key)
    .arg(end);
    let _: i64 = conn.query(&cmd).await?;
    Ok(())
}

/// Whole seconds of event time between the end of the oldest window that waits and `wm` (the
/// counter's watermark after lateness, Unix ms). A window waits when it has keys (`ends`: the
/// ends of the windows found in Redis), has closed (ends at or before `closed_end`) and ends
/// after `progress`. 0 when none waits.
pub fn behind_seconds(
    ends: impl IntoIterator<Item = i64>,
    progress: Option<i64>,
    closed_end: i64,
    wm: i64,
) -> i64 {
    let oldest = ends
        .into_iter()
        .filter(|&end| end <= closed_end && progress.is_none_or(|p| end > p))
        .min();
    oldest.map_or(0, |end| (wm - end).max(0) / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn nothing_published_yet_is_behind_from_the_first_closed_window() {
        // Windows of minutes 0, 1 and 2 have keys; the watermark is 30 s into minute 3.
        let ends = [MIN, 2 * MIN, 3 * MIN];
        let wm = 3 * MIN + 30_000;
        assert_eq!(behind_seconds(ends, None, 3 * MIN, wm), 150);
        // A later watermark: further behind, as long as nothing is published.
        assert_eq!(behind_seconds(ends, None, 5 * MIN, 5 * MIN + 1), 240);
    }

    #[test]
    fn behind_counts_from_the_oldest_window_after_the_progress() {
        let ends = [MIN, 2 * MIN, 3 * MIN];
        let wm = 3 * MIN + 30_000;
        assert_eq!(behind_seconds(ends, Some(MIN), 3 * MIN, wm), 90);
        assert_eq!(
            behind_seconds(ends, Some(3 * MIN), 3 * MIN, wm),
            0,
            "all out"
        );
        // Open windows never count.
        assert_eq!(behind_seconds([4 * MIN], Some(3 * MIN), 3 * MIN, wm), 0);
        // Closed windows without keys have nothing to publish.
        assert_eq!(behind_seconds([], Some(MIN), 3 * MIN, wm), 0);
    }
}
