//! Time windows aligned to a time zone's wall clock.
//!
//! A counter key names its window by the window's *local* start (e.g. `2025080117`), so
//! windows are cut on the configured zone's wall clock, not on UTC. Each window also needs
//! its exact UTC bounds: the end is when the Redis key should expire.
//!
//! Rules, chosen so that windows tile the time line exactly (the end of one window is the
//! start of the next, no instant belongs to two windows, no two windows share a local start):
//!
//! * A window's local start is local midnight plus a whole number of window sizes.
//! * A local time is turned into an instant by taking the *earliest* instant whose local time
//!   is at or after it: a time that happens twice (clocks going back) gives the first
//!   occurrence, a time that never happens (clocks going forward) gives the instant the clocks
//!   jump.
//! * When the clocks go back, the window that was running at the jump keeps running until the
//!   wall clock passes its end again. With 1h windows and a 1h fall-back this is the single
//!   two-hour `01:00` window; with windows smaller than the fall-back, the repeated times do
//!   not start new windows (they would reuse keys of windows that have already expired).
//!
//! Windows may therefore be longer or shorter than their nominal size in UTC around DST
//! changes, and a window that lies entirely inside a spring-forward gap is empty and is never
//! returned.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Offset, TimeZone};
use chrono_tz::{GapInfo, Tz};

/// Seconds in a day: every window size must divide it so windows line up with local midnight.
const DAY_SECS: u32 = 86_400;

/// Milliseconds in a day, for the search bound in [`WindowSpec::search`].
const DAY_MS: i64 = 86_400_000;

/// Earliest supported event time (0001-01-02T00:00:00Z). Earlier timestamps are clamped so
/// that local times stay within years 1..=9999 (four-digit years in keys) in every zone.
pub const MIN_TS_MS: i64 = -62_135_510_400_000;

/// Latest supported event time (9999-12-29T23:59:59.999Z). Later timestamps are clamped, for
/// the same reason as [`MIN_TS_MS`]; the margin leaves room for a one-day window after it.
pub const MAX_TS_MS: i64 = 253_402_127_999_999;

/// Why a window size was rejected; messages are written for someone editing the config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// Zero or sub-second sizes would create a key per millisecond and cannot be named by the
    /// second-resolution time patterns of key templates.
    #[error("window size {size:?} is too small: windows must be at least 1s")]
    TooSmall {
        /// The configured size.
        size: Duration,
    },
    /// Keys name windows with second resolution, so fractions of a second cannot be told apart.
    #[error("window size {size:?} is not a whole number of seconds (e.g. use 1s, 1m, 15m, 1h)")]
    NotWholeSeconds {
        /// The configured size.
        size: Duration,
    },
    /// Windows are aligned to local midnight, so they cannot span more than one day.
    #[error("window size {} is longer than a day: the largest supported window is 1d", format_secs(size.as_secs()))]
    LongerThanDay {
        /// The configured size.
        size: Duration,
    },
    /// Otherwise the last window of each day would be cut short at midnight.
    #[error(
        "window size {} does not divide a day: 24h must be a whole number of windows \
         (e.g. 1s, 10s, 1m, 5m, 15m, 30m, 1h, 6h, 1d)",
        format_secs(size.as_secs())
    )]
    DoesNotDivideDay {
        /// The configured size.
        size: Duration,
    },
}

/// Window size must divide 24h exactly and be >= 1s (e.g. 1s, 10s, 1m, 5m, 15m, 1h, 6h, 1d).
///
/// Validated once at startup so that [`WindowSpec::window_of`] cannot fail on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// Window size in seconds; divides 86 400, so windows align with local midnight.
    size_secs: u32,
    /// Zone whose wall clock the windows follow, so keys match the local hours users see.
    tz: Tz,
    /// True when `tz` is a fixed zero-offset zone, enabling the integer-only fast path.
    utc: bool,
}

/// One counting window: its exact UTC bounds and the wall-clock time it is named after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First instant in the window (inclusive), Unix epoch milliseconds.
    pub start_ms: i64,
    /// First instant after the window (exclusive), Unix epoch milliseconds; the next window
    /// starts here and the window's keys can expire here.
    pub end_ms: i64,
    /// The window's start on the configured zone's wall clock; keys are named after it.
    pub local_start: NaiveDateTime,
}

impl WindowSpec {
    /// Validates `size` (whole seconds, at least 1s, dividing a day) for windows on `tz`'s
    /// wall clock.
    pub fn new(size: Duration, tz: Tz) -> Result<Self, WindowError> {
        if size < Duration::from_secs(1) {
            return Err(WindowError::TooSmall { size });
        }
        if size.subsec_nanos() != 0 {
            return Err(WindowError::NotWholeSeconds { size });
        }
        let secs = size.as_secs();
        if secs > u64::from(DAY_SECS) {
            return Err(WindowError::LongerThanDay { size });
        }
        if u64::from(DAY_SECS) % secs != 0 {
            return Err(WindowError::DoesNotDivideDay { size });
        }
        Ok(Self {
            // Cannot truncate: secs <= DAY_SECS was checked above.
            size_secs: secs as u32,
            tz,
            utc: is_fixed_utc(tz),
        })
    }

    /// Window size in seconds, for callers that derive TTLs or validate key templates.
    pub fn size_secs(&self) -> u32 {
        self.size_secs
    }

    /// The zone whose wall clock the windows follow.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The window containing instant `ts_ms` (Unix epoch milliseconds, may be negative).
    ///
    /// Timestamps outside [`MIN_TS_MS`]..=[`MAX_TS_MS`] (years 1 to 9999) are clamped into that
    /// range, so the returned window does not contain them; callers should reject such
    /// timestamps before counting.
    pub fn window_of(&self, ts_ms: i64) -> Window {
        let ts = ts_ms.clamp(MIN_TS_MS, MAX_TS_MS);
        let size = self.size_ms();
        if self.utc {
            // Hot path: no zone lookups, the wall clock is the UTC clock.
            let start = ts.div_euclid(size) * size;
            return Window {
                start_ms: start,
                end_ms: start + size,
                local_start: naive_from_ms(start),
            };
        }
        let local = ts + self.offset_ms(ts);
        let local_start = local.div_euclid(size) * size;
        let start = self.resolve(local_start);
        let end = self.resolve(local_start + size);
        if start <= ts && ts < end {
            return Window {
                start_ms: start,
                end_ms: end,
                local_start: naive_from_ms(local_start),
            };
        }
        // Only reached for instants in the repeated part of a fall-back when windows are
        // smaller than the fall-back: the naive window ended during the first pass.
        self.search(ts, local_start, start)
    }

    /// Window size in milliseconds.
    fn size_ms(&self) -> i64 {
        i64::from(self.size_secs) * 1000
    }

    /// UTC offset in effect at instant `ts` (milliseconds to add to UTC to get wall-clock time).
    fn offset_ms(&self, ts: i64) -> i64 {
        let off = self.tz.offset_from_utc_datetime(&naive_from_ms(ts)).fix();
        i64::from(off.local_minus_utc()) * 1000
    }

    /// Earliest instant whose wall-clock time is at or after `local_ms` (wall-clock time as
    /// milliseconds since 1970-01-01T00:00 local): the first occurrence of a repeated time, or
    /// the jump instant for a time skipped by the clocks going forward.
    fn resolve(&self, local_ms: i64) -> i64 {
        let naive = naive_from_ms(local_ms);
        match self.tz.offset_from_local_datetime(&naive) {
            chrono::LocalResult::Single(off) => local_ms - offset_to_ms(off),
            chrono::LocalResult::Ambiguous(a, b) => {
                (local_ms - offset_to_ms(a)).min(local_ms - offset_to_ms(b))
            }
            chrono::LocalResult::None => self.gap_start(&naive, local_ms),
        }
    }

    /// The instant the clocks jumped forward over the skipped wall-clock time `naive`.
    fn gap_start(&self, naive: &NaiveDateTime, local_ms: i64) -> i64 {
        match GapInfo::new(naive, &self.tz) {
            // The gap begins at `begin` on the old offset's clock, which is the jump instant.
            Some(GapInfo {
                begin: Some((begin, off)),
                ..
            }) => begin.and_utc().timestamp_millis() - offset_to_ms(off),
            // The first wall-clock time after the gap happens exactly at the jump instant.
            Some(GapInfo { end: Some(end), .. }) => end.timestamp_millis(),
            // Not reachable with tzdb data (a gap always has a known side); the offset at the
            // same numeric instant keeps the result within a day of the truth.
            _ => local_ms - self.offset_ms(local_ms),
        }
    }

    /// Finds the window containing `ts` when the naive candidate (local start `guess`, which
    /// resolves to `start`) does not: the latest aligned local start that resolves at or before
    /// `ts`. Resolution is monotonic, so that window contains `ts` and windows still tile.
    fn search(&self, ts: i64, guess: i64, start: i64) -> Window {
        let size = self.size_ms();
        // Wall clock and UTC differ by less than a day in every zone, so four days bounds the
        // search in both directions.
        let limit = 4 * DAY_MS / size;
        // Invariant: resolve(guess + lo * size) <= ts < resolve(guess + hi * size).
        let (mut lo, mut hi);
        if start <= ts {
            // The candidate ended at or before `ts` (resolve(guess + size) <= ts): gallop forward.
            lo = 1;
            let mut step = 2;
            loop {
                if step >= limit || self.resolve(guess + step * size) > ts {
                    hi = step.min(limit);
                    break;
                }
                lo = step;
                step *= 2;
            }
        } else {
            // Not expected with tzdb data; kept so every input yields a containing window.
            hi = 0;
            let mut step = 1;
            loop {
                if step >= limit || self.resolve(guess - step * size) <= ts {
                    lo = -step.min(limit);
                    break;
                }
                hi = -step;
                step *= 2;
            }
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.resolve(guess + mid * size) <= ts {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let local_start = guess + lo * size;
        let start = self.resolve(local_start);
        let end = self.resolve(local_start + size);
        Window {
            // Safety net for corrupt zone data only: never return a window missing `ts`.
            start_ms: start.min(ts),
            end_ms: end.max(ts + 1),
            local_start: naive_from_ms(local_start),
        }
    }
}

/// Remembers the last window so consecutive events in the same window skip the tz computation.
#[derive(Debug, Clone)]
pub struct WindowCache {
    /// How windows are cut.
    spec: WindowSpec,
    /// The most recently computed window; starts empty so the first lookup always computes.
    last: Window,
}

impl WindowCache {
    /// An empty cache for windows cut by `spec`.
    pub fn new(spec: WindowSpec) -> Self {
        Self {
            spec,
            last: Window {
                start_ms: 0,
                end_ms: 0,
                local_start: NaiveDateTime::default(),
            },
        }
    }

    /// The window containing `ts_ms`, as [`WindowSpec::window_of`], computed only when `ts_ms`
    /// falls outside the previously returned window.
    pub fn get(&mut self, ts_ms: i64) -> &Window {
        // Clamp first so out-of-range timestamps hit the cache of the clamped window.
        let ts = ts_ms.clamp(MIN_TS_MS, MAX_TS_MS);
        if !(self.last.start_ms <= ts && ts < self.last.end_ms) {
            self.last = self.spec.window_of(ts);
        }
        &self.last
    }

    /// The spec this cache computes windows for.
    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }
}

/// Formats a whole number of seconds the way a config file would spell it (`90` -> `1m30s`),
/// so error messages echo the user's own units.
pub(crate) fn format_secs(secs: u64) -> String {
    if secs == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut rest = secs;
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if rest >= len {
            out.push_str(&(rest / len).to_string());
            out.push_str(unit);
            rest %= len;
        }
    }
    out
}

/// Zones with a constant zero offset over all of history, eligible for the integer fast path.
fn is_fixed_utc(tz: Tz) -> bool {
    matches!(
        tz,
        Tz::UTC
            | Tz::Etc__UTC
            | Tz::UCT
            | Tz::Etc__UCT
            | Tz::GMT
            | Tz::Etc__GMT
            | Tz::GMT0
            | Tz::Etc__GMT0
            | Tz::GMTPlus0
            | Tz::Etc__GMTPlus0
            | Tz::GMTMinus0
            | Tz::Etc__GMTMinus0
            | Tz::Greenwich
            | Tz::Etc__Greenwich
            | Tz::Universal
            | Tz::Etc__Universal
            | Tz::Zulu
            | Tz::Etc__Zulu
    )
}

/// A zone offset in milliseconds.
fn offset_to_ms(off: chrono_tz::TzOffset) -> i64 {
    i64::from(off.fix().local_minus_utc()) * 1000
}

/// Milliseconds since 1970-01-01T00:00 as a naive date-time. Saturates instead of panicking
/// outside chrono's range (about ±262 000 years), which clamped inputs never reach.
fn naive_from_ms(ms: i64) -> NaiveDateTime {
    match DateTime::from_timestamp_millis(ms) {
        Some(dt) => dt.naive_utc(),
        None if ms < 0 => NaiveDateTime::MIN,
        None => NaiveDateTime::MAX,
    }
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
