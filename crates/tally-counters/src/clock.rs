//! The host's wall clock, one helper for every path. What it decides is the caller's to say:
//! tally never decides a count or a limit by it (Redis' `TIME` does that inside the scripts);
//! it picks windows for events without a time, stamps logs and answers, and paces jobs.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, Unix milliseconds (0 before 1970, `i64::MAX` past year 292 million).
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Now, Unix seconds.
pub fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_two_units_agree() {
        let (ms, s) = (super::unix_ms(), super::unix_secs());
        assert!(ms > 1_700_000_000_000, "{ms}");
        assert!((ms / 1000).abs_diff(s as i64) <= 1, "{ms} vs {s}");
    }
}
