//! Tests for `window.rs`: explicit DST cases plus property tests of the tiling invariants.

use super::*;
use chrono::{NaiveDate, Timelike};
use proptest::prelude::*;

const SEC: i64 = 1_000;
const MIN: i64 = 60 * SEC;
const HOUR: i64 = 60 * MIN;

/// Zones exercising whole-hour, half-hour and 45-minute offsets, both hemispheres' DST,
/// 30-minute DST and DST at midnight.
const ZONES: [Tz; 7] = [
    Tz::UTC,
    Tz::Asia__Kolkata,
    Tz::Asia__Kathmandu,
    Tz::America__New_York,
    Tz::Europe__Berlin,
    Tz::Australia__Lord_Howe,
    Tz::America__Santiago,
];

const SIZES: [u64; 5] = [1, 60, 900, 3600, 86_400];

fn spec(secs: u64, tz: Tz) -> WindowSpec {
    WindowSpec::new(Duration::from_secs(secs), tz).expect("valid test window size")
}

/// Instant `y-m-d h:mi:s` UTC in epoch milliseconds.
fn utc(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    naive(y, m, d, h, mi, s).and_utc().timestamp_millis()
}

fn naive(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, m, d)
        .and_then(|d| d.and_hms_opt(h, mi, s))
        .expect("valid test date")
}

/// Checks the invariants every window must satisfy for `ts` and returns the window.
fn check(spec: &WindowSpec, ts: i64) -> Window {
    let w = spec.window_of(ts);
    let ctx = format!("tz={} size={} ts={ts} w={w:?}", spec.tz(), spec.size_secs());
    assert!(w.start_ms <= ts && ts < w.end_ms, "contains: {ctx}");
    assert_eq!(spec.window_of(w.start_ms), w, "start maps back: {ctx}");
    assert_eq!(spec.window_of(w.end_ms - 1), w, "last ms maps back: {ctx}");
    assert_eq!(spec.window_of(w.end_ms).start_ms, w.end_ms, "tiling: {ctx}");
    let secs_of_day = i64::from(w.local_start.num_seconds_from_midnight());
    assert_eq!(
        secs_of_day % i64::from(spec.size_secs()),
        0,
        "aligned: {ctx}"
    );
    // The local start is never earlier than the instant's own wall-clock window.
    let local = ts + spec.offset_ms(ts);
    let floor = local.div_euclid(spec.size_ms()) * spec.size_ms();
    assert!(
        naive_from_ms(floor) <= w.local_start,
        "not before wall clock: {ctx}"
    );
    w
}

/// Walks consecutive windows from `from` until `to`, checking each and that local starts
/// strictly increase (so no two windows can share a key).
fn walk(spec: &WindowSpec, from: i64, to: i64) -> usize {
    let mut ts = from;
    let mut prev: Option<Window> = None;
    let mut n = 0;
    while ts < to {
        let w = check(spec, ts);
        if let Some(p) = prev {
            assert_eq!(p.end_ms, w.start_ms, "gapless: {p:?} then {w:?}");
            assert!(
                p.local_start < w.local_start,
                "increasing: {p:?} then {w:?}"
            );
        }
        prev = Some(w);
        ts = w.end_ms;
        n += 1;
    }
    n
}

/// Instants (to the second) where `tz`'s offset changes between `from` and `to`, found by
/// scanning every 6 hours and bisecting.
fn transitions(tz: Tz, from: i64, to: i64) -> Vec<i64> {
    let s = spec(1, tz);
    let mut out = Vec::new();
    let mut t = from;
    while t < to {
        let next = t + 6 * HOUR;
        if s.offset_ms(t) != s.offset_ms(next) {
            let (mut lo, mut hi) = (t / SEC, next / SEC);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if s.offset_ms(mid * SEC) == s.offset_ms(t) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            out.push(hi * SEC);
        }
        t = next;
    }
    out
}

#[test]
fn accepts_sizes_dividing_a_day() {
    for secs in [1, 10, 60, 90, 300, 900, 1800, 3600, 6 * 3600, 86_400] {
        let s = spec(secs, Tz::UTC);
        assert_eq!(s.size_secs() as u64, secs);
        assert_eq!(s.tz(), Tz::UTC);
    }
}

#[test]
fn rejects_bad_sizes_with_clear_messages() {
    let err = |d: Duration| WindowSpec::new(d, Tz::UTC).expect_err("must be rejected");
    assert_eq!(
        err(Duration::ZERO),
        WindowError::TooSmall {
            size: Duration::ZERO
        }
    );
    assert!(matches!(
        err(Duration::from_millis(500)),
        WindowError::TooSmall { .. }
    ));
    let e = err(Duration::from_millis(1500));
    assert!(matches!(e, WindowError::NotWholeSeconds { .. }));
    assert!(e.to_string().contains("1.5s"), "{e}");
    let e = err(Duration::from_secs(7 * 60));
    assert!(matches!(e, WindowError::DoesNotDivideDay { .. }));
    assert!(
        e.to_string()
            .starts_with("window size 7m does not divide a day"),
        "{e}"
    );
    let e = err(Duration::from_secs(2 * 86_400));
    assert!(matches!(e, WindowError::LongerThanDay { .. }));
    assert!(e.to_string().contains("2d is longer than a day"), "{e}");
    let e = err(Duration::from_secs(25 * 3600));
    assert!(e.to_string().contains("1d1h"), "{e}");
}

#[test]
fn format_secs_uses_config_units() {
    assert_eq!(format_secs(0), "0s");
    assert_eq!(format_secs(90), "1m30s");
    assert_eq!(format_secs(3600), "1h");
    assert_eq!(format_secs(86_400 + 61), "1d1m1s");
}

#[test]
fn utc_hourly_boundaries_are_exact() {
    let s = spec(3600, Tz::UTC);
    let w = s.window_of(utc(2025, 8, 1, 17, 59, 59) + 999);
    assert_eq!(w.start_ms, utc(2025, 8, 1, 17, 0, 0));
    assert_eq!(w.end_ms, utc(2025, 8, 1, 18, 0, 0));
    assert_eq!(w.local_start, naive(2025, 8, 1, 17, 0, 0));
    let next = s.window_of(utc(2025, 8, 1, 18, 0, 0));
    assert_eq!(next.start_ms, w.end_ms);
    assert_eq!(next.local_start, naive(2025, 8, 1, 18, 0, 0));
}

#[test]
fn negative_timestamps_work() {
    let s = spec(3600, Tz::UTC);
    let w = s.window_of(-1);
    assert_eq!((w.start_ms, w.end_ms), (-HOUR, 0));
    assert_eq!(w.local_start, naive(1969, 12, 31, 23, 0, 0));
    let ny = spec(86_400, Tz::America__New_York);
    let w = check(&ny, utc(1955, 6, 15, 12, 0, 0));
    assert_eq!(w.local_start, naive(1955, 6, 15, 0, 0, 0));
    // June 1955 New York was on EDT (-4h).
    assert_eq!(w.start_ms, utc(1955, 6, 15, 4, 0, 0));
    check(&spec(900, Tz::Europe__Berlin), utc(1900, 1, 1, 0, 7, 0));
}

#[test]
fn kolkata_and_kathmandu_hours_start_off_the_utc_hour() {
    let kol = spec(3600, Tz::Asia__Kolkata);
    let w = kol.window_of(utc(2025, 8, 1, 11, 45, 0));
    assert_eq!(w.start_ms, utc(2025, 8, 1, 11, 30, 0));
    assert_eq!(w.local_start, naive(2025, 8, 1, 17, 0, 0));
    let ktm = spec(3600, Tz::Asia__Kathmandu);
    let w = ktm.window_of(utc(2025, 8, 1, 11, 45, 0));
    assert_eq!(w.start_ms, utc(2025, 8, 1, 11, 15, 0));
    assert_eq!(w.end_ms, utc(2025, 8, 1, 12, 15, 0));
}

#[test]
fn new_york_fall_back_hour_is_one_two_hour_window() {
    let s = spec(3600, Tz::America__New_York);
    // 2025-11-02 01:30 happens at 05:30Z (EDT) and again at 06:30Z (EST).
    let first = s.window_of(utc(2025, 11, 2, 5, 30, 0));
    let second = s.window_of(utc(2025, 11, 2, 6, 30, 0));
    assert_eq!(first, second);
    assert_eq!(first.local_start, naive(2025, 11, 2, 1, 0, 0));
    assert_eq!(first.start_ms, utc(2025, 11, 2, 5, 0, 0));
    assert_eq!(first.end_ms, utc(2025, 11, 2, 7, 0, 0));
    let next = s.window_of(first.end_ms);
    assert_eq!(next.local_start, naive(2025, 11, 2, 2, 0, 0));
}

#[test]
fn new_york_minute_windows_do_not_restart_in_repeated_hour() {
    // Windows smaller than the fall-back: the 01:59 window runs until the wall clock passes
    // 02:00 again, so repeated local times never reuse an expired window's key.
    let s = spec(60, Tz::America__New_York);
    let w = s.window_of(utc(2025, 11, 2, 6, 30, 0)); // 01:30 EST, second pass.
    assert_eq!(w.local_start, naive(2025, 11, 2, 1, 59, 0));
    assert_eq!(w.start_ms, utc(2025, 11, 2, 5, 59, 0));
    assert_eq!(w.end_ms, utc(2025, 11, 2, 7, 0, 0));
    let s = spec(900, Tz::America__New_York);
    let w = s.window_of(utc(2025, 11, 2, 6, 0, 0)); // 01:00 EST
    assert_eq!(w.local_start, naive(2025, 11, 2, 1, 45, 0));
    assert_eq!(w.end_ms - w.start_ms, 75 * MIN);
}

#[test]
fn new_york_dst_days_are_23_and_25_hours() {
    let s = spec(86_400, Tz::America__New_York);
    let spring = s.window_of(utc(2025, 3, 9, 12, 0, 0));
    assert_eq!(spring.local_start, naive(2025, 3, 9, 0, 0, 0));
    assert_eq!(spring.end_ms - spring.start_ms, 23 * HOUR);
    let fall = s.window_of(utc(2025, 11, 2, 12, 0, 0));
    assert_eq!(fall.end_ms - fall.start_ms, 25 * HOUR);
    let normal = s.window_of(utc(2025, 8, 1, 12, 0, 0));
    assert_eq!(normal.end_ms - normal.start_ms, 24 * HOUR);
}

#[test]
fn new_york_spring_forward_skips_the_missing_hour() {
    let s = spec(3600, Tz::America__New_York);
    // 2025-03-09 02:00 EST (07:00Z) jumps to 03:00 EDT.
    let before = s.window_of(utc(2025, 3, 9, 6, 30, 0));
    assert_eq!(before.local_start, naive(2025, 3, 9, 1, 0, 0));
    assert_eq!(before.end_ms, utc(2025, 3, 9, 7, 0, 0));
    let after = s.window_of(before.end_ms);
    assert_eq!(after.local_start, naive(2025, 3, 9, 3, 0, 0));
    assert_eq!(after.end_ms - after.start_ms, HOUR);
}

#[test]
fn lord_howe_half_hour_dst() {
    let s = spec(3600, Tz::Australia__Lord_Howe);
    // 2025-04-06 02:00 +11 (15:00Z) falls back to 01:30 +10:30: the 01:00 window is 1.5h.
    let w = s.window_of(utc(2025, 4, 5, 15, 10, 0));
    assert_eq!(w.local_start, naive(2025, 4, 6, 1, 0, 0));
    assert_eq!(w.start_ms, utc(2025, 4, 5, 14, 0, 0));
    assert_eq!(w.end_ms, utc(2025, 4, 5, 15, 30, 0));
    // 2025-10-05 02:00 +10:30 (15:30Z) jumps to 02:30 +11: the 02:00 window is 30 minutes.
    let w = s.window_of(utc(2025, 10, 4, 15, 45, 0));
    assert_eq!(w.local_start, naive(2025, 10, 5, 2, 0, 0));
    assert_eq!(w.start_ms, utc(2025, 10, 4, 15, 30, 0));
    assert_eq!(w.end_ms, utc(2025, 10, 4, 16, 0, 0));
}

#[test]
fn santiago_midnight_dst() {
    let s = spec(86_400, Tz::America__Santiago);
    // 2024-09-08 00:00 -04 does not exist (clocks jump to 01:00 -03 at 04:00Z).
    let w = s.window_of(utc(2024, 9, 8, 12, 0, 0));
    assert_eq!(w.local_start, naive(2024, 9, 8, 0, 0, 0));
    assert_eq!(w.start_ms, utc(2024, 9, 8, 4, 0, 0));
    assert_eq!(w.end_ms - w.start_ms, 23 * HOUR);
    assert_eq!(s.window_of(w.start_ms - 1).end_ms, w.start_ms);
    // 2024-04-07 00:00 -03 (03:00Z) falls back to 2024-04-06 23:00 -04: Apr 6 is 25h.
    let w = s.window_of(utc(2024, 4, 6, 12, 0, 0));
    assert_eq!(w.local_start, naive(2024, 4, 6, 0, 0, 0));
    assert_eq!(w.end_ms - w.start_ms, 25 * HOUR);
    let hourly = spec(3600, Tz::America__Santiago);
    let w = hourly.window_of(utc(2024, 9, 8, 4, 0, 0));
    assert_eq!(w.local_start, naive(2024, 9, 8, 1, 0, 0));
}

#[test]
fn utc_aliases_are_fixed_zero_offset() {
    for tz in chrono_tz::TZ_VARIANTS {
        if !is_fixed_utc(tz) {
            continue;
        }
        let general = WindowSpec {
            size_secs: 60,
            tz,
            utc: false,
        };
        for ts in [utc(1800, 1, 1, 0, 0, 0), 0, utc(2025, 8, 1, 17, 0, 0)] {
            assert_eq!(general.offset_ms(ts), 0, "{tz}");
        }
    }
    assert!(is_fixed_utc(Tz::Etc__UTC));
    assert!(!is_fixed_utc(Tz::Europe__London));
}

#[test]
fn out_of_range_timestamps_are_clamped() {
    assert_eq!(
        naive_from_ms(MIN_TS_MS),
        naive(1, 1, 2, 0, 0, 0),
        "MIN_TS_MS"
    );
    assert_eq!(
        naive_from_ms(MAX_TS_MS + 1),
        naive(9999, 12, 30, 0, 0, 0),
        "MAX_TS_MS"
    );
    assert_eq!(naive_from_ms(i64::MIN), NaiveDateTime::MIN);
    assert_eq!(naive_from_ms(i64::MAX), NaiveDateTime::MAX);
    for tz in ZONES
        .into_iter()
        .chain([Tz::Pacific__Kiritimati, Tz::Asia__Manila])
    {
        for secs in SIZES {
            let s = spec(secs, tz);
            let lo = s.window_of(i64::MIN);
            assert_eq!(lo, check(&s, MIN_TS_MS));
            // Tiling cannot hold past the clamp, so only containment is checked at the top.
            let hi = s.window_of(i64::MAX);
            assert_eq!(hi, s.window_of(MAX_TS_MS));
            assert!(
                hi.start_ms <= MAX_TS_MS && MAX_TS_MS < hi.end_ms,
                "{tz} {secs}"
            );
            let year = |w: Window| chrono::Datelike::year(&w.local_start);
            assert!(year(lo) >= 1 && year(hi) <= 9999, "{tz} {secs}");
        }
    }
}

#[test]
fn cache_matches_window_of_and_reuses_windows() {
    let s = spec(3600, Tz::America__New_York);
    let mut cache = WindowCache::new(s);
    assert_eq!(cache.spec(), &s);
    let base = utc(2025, 11, 2, 4, 0, 0);
    for ts in [
        base,
        base + 1,
        base + 3 * HOUR,
        base + HOUR + 5,
        base + 2 * HOUR + 5,
        0,
        -1,
        i64::MAX,
        i64::MIN,
        0,
    ] {
        assert_eq!(*cache.get(ts), s.window_of(ts), "ts={ts}");
    }
    // A hit returns the stored window without recomputing (same bounds either way).
    let w = *cache.get(base + 10);
    assert_eq!(cache.get(base + 20), &w);
}

#[test]
fn walks_tile_two_years_hourly_and_daily() {
    let (from, to) = (utc(2024, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 0, 0));
    for tz in ZONES {
        walk(&spec(86_400, tz), from, to);
        let n = walk(&spec(3600, tz), from, to);
        // Two years of hours, give or take DST.
        assert!((17_540..=17_560).contains(&n), "{tz}: {n} windows");
    }
}

#[test]
fn walks_tile_around_every_transition() {
    // Historic transitions include odd local-mean-time offsets and wartime changes.
    let (from, to) = (utc(1880, 1, 1, 0, 0, 0), utc(2040, 1, 1, 0, 0, 0));
    let recent = utc(2020, 1, 1, 0, 0, 0);
    for tz in ZONES {
        let ts = transitions(tz, from, to);
        assert_eq!(ts.is_empty(), tz == Tz::UTC, "{tz}");
        if tz == Tz::America__New_York {
            assert!(ts.len() > 200, "scan found only {} transitions", ts.len());
        }
        for &t in &ts {
            for secs in [60, 900, 3600, 86_400] {
                walk(&spec(secs, tz), t - 3 * HOUR, t + 3 * HOUR);
            }
            if t >= recent {
                walk(&spec(1, tz), t - 2 * MIN, t + 2 * MIN);
            }
        }
    }
}

/// Every offset change of the test zones in 2020-2030, computed once.
fn recent_transitions() -> &'static [(Tz, i64)] {
    static ALL: std::sync::OnceLock<Vec<(Tz, i64)>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let (from, to) = (utc(2020, 1, 1, 0, 0, 0), utc(2030, 1, 1, 0, 0, 0));
        ZONES
            .into_iter()
            .flat_map(|tz| transitions(tz, from, to).into_iter().map(move |t| (tz, t)))
            .collect()
    })
}

fn zone() -> impl Strategy<Value = Tz> {
    proptest::sample::select(ZONES.to_vec())
}

fn size() -> impl Strategy<Value = u64> {
    proptest::sample::select(SIZES.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn windows_contain_and_tile(
        tz in zone(),
        secs in size(),
        ts in utc(1800, 1, 1, 0, 0, 0)..utc(2200, 1, 1, 0, 0, 0),
    ) {
        check(&spec(secs, tz), ts);
    }

    #[test]
    fn windows_near_recent_dst_changes(
        tz in zone(),
        secs in size(),
        day in 0i64..(366 * 4),
        ms in 0i64..(24 * HOUR),
    ) {
        // Uniform over 2023-2026 so DST days are hit regularly.
        check(&spec(secs, tz), utc(2023, 1, 1, 0, 0, 0) + day * 24 * HOUR + ms);
    }

    #[test]
    fn windows_near_transitions(
        pick in any::<proptest::sample::Index>(),
        secs in size(),
        delta in -3 * HOUR..3 * HOUR,
    ) {
        let all = recent_transitions();
        let (tz, t) = all[pick.index(all.len())];
        check(&spec(secs, tz), t + delta);
    }

    #[test]
    fn utc_fast_path_matches_general_path(secs in size(), ts in any::<i64>()) {
        let general = WindowSpec { size_secs: secs as u32, tz: Tz::UTC, utc: false };
        prop_assert_eq!(spec(secs, Tz::UTC).window_of(ts), general.window_of(ts));
    }

    #[test]
    fn cache_agrees_with_window_of(
        tz in zone(),
        secs in size(),
        steps in proptest::collection::vec(-2 * HOUR..2 * HOUR, 1..50),
    ) {
        let s = spec(secs, tz);
        let mut cache = WindowCache::new(s);
        let mut ts = utc(2025, 11, 2, 0, 0, 0);
        for step in steps {
            ts += step;
            prop_assert_eq!(*cache.get(ts), s.window_of(ts));
        }
    }
}
