//! End-to-end: Kafka (mock cluster) → tally → Redis, exact counts and expiry times.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{counter, wait_for, Harness};
use chrono::{DateTime, Datelike, TimeZone, Timelike, Utc};
use tally::model::stored_expire_at;

const HOUR: i64 = 3_600_000;

fn hour_floor(ms: i64) -> i64 {
    ms - ms.rem_euclid(HOUR)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_counts_and_expiry_across_windows_partitions_and_counters() {
    let mut h = Harness::new("exact", 4);
    let config = config(&h);
    let mut truth = Truth {
        now: Utc::now().timestamp_millis(),
        want: BTreeMap::new(),
        daily_late: 0,
    };
    let n = produce(&mut h, &mut truth);
    h.flush_producer();

    let running = h.start(config);
    h.wait_applied("g-exact", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    wait_for("consumed metric", Duration::from_secs(10), || {
        m.consumer.messages_consumed.get() == n
    })
    .await;
    running.stop().await;
    stored_keys_are_the_truth(&h, &truth.want);
    assert_eq!(crate::common::events_counted(&m, "flow"), n);
    assert_eq!(
        m.aggregate.late_events.with_label_values(&["daily"]).get(),
        truth.daily_late
    );
}

/// A flow count, a day in Kolkata with zero retention, a minute per ip and a sum of bytes.
fn config(h: &Harness) -> tally::config::Config {
    let day = Duration::from_secs(86_400);
    let mut sum = counter(
        "bytes",
        &["app_id"],
        "bytes:{app_id}:{yyyyMMddHH}",
        Duration::from_secs(3600),
        "UTC",
        day,
    );
    sum.value_field = Some("bytes".into());
    let counters = vec![
        // The reference design, but kept a day past the window so past hours are not late.
        counter(
            "flow",
            &["app_id", "device_id", "ip"],
            "flow:count:{app_id}:{device_id}:{ip}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            day,
        ),
        counter(
            "daily",
            &["app_id"],
            "daily:{app_id}:{yyyyMMdd}",
            day,
            "Asia/Kolkata",
            Duration::ZERO,
        ),
        counter(
            "minute",
            &["ip"],
            "minute:{ip}:{yyyyMMddHHmm}",
            Duration::from_secs(60),
            "UTC",
            day,
        ),
        sum,
    ];
    let mut config = h.config("g-exact", counters);
    config.decode.time_field = Some("ts".into());
    config
}

/// Ground truth, computed here independently of tally's window and key code: key -> (count,
/// expire-at ms), and the events late for `daily`.
struct Truth {
    now: i64,
    want: BTreeMap<String, (i64, i64)>,
    daily_late: u64,
}

impl Truth {
    /// One event's share of every counter.
    fn add(&mut self, ts: i64, app: &str, dev: &str, ip: &str, bytes: i64) {
        let (now, want) = (self.now, &mut self.want);
        let kolkata = chrono_tz::Asia::Kolkata;
        let t: DateTime<Utc> = Utc.timestamp_millis_opt(ts).unwrap();
        let ip_key = ip.replace(':', "%3A");
        let hour_end = hour_floor(ts) + HOUR;
        let flow = format!("flow:count:{app}:{dev}:{ip_key}:{}", t.format("%Y%m%d%H"));
        let e = want.entry(flow).or_insert((0, hour_end + 86_400_000));
        e.0 += 1;
        let local = t.with_timezone(&kolkata);
        let local_midnight = kolkata
            .with_ymd_and_hms(local.year(), local.month(), local.day(), 0, 0, 0)
            .unwrap()
            .timestamp_millis();
        let daily = format!("daily:{app}:{}", local.format("%Y%m%d"));
        // Zero retention: a Kolkata day that ended already (events up to three hours old,
        // shortly after midnight there) is late, counted as such and never written.
        if local_midnight + 86_400_000 <= now {
            self.daily_late += 1;
        } else {
            want.entry(daily)
                .or_insert((0, local_midnight + 86_400_000))
                .0 += 1;
        }
        let minute_end = ts - ts.rem_euclid(60_000) + 60_000;
        let minute = format!("minute:{ip_key}:{}{:02}", t.format("%Y%m%d%H"), t.minute());
        want.entry(minute).or_insert((0, minute_end + 86_400_000)).0 += 1;
        let b = format!("bytes:{app}:{}", t.format("%Y%m%d%H"));
        want.entry(b).or_insert((0, hour_end + 86_400_000)).0 += bytes;
    }
}

/// Three hours of events (2,000 an hour) over 4 partitions; returns how many.
fn produce(h: &mut Harness, truth: &mut Truth) -> u64 {
    let now = truth.now;
    let mut n = 0u64;
    for hour_back in 0..3i64 {
        for i in 0..2_000i64 {
            let ts = hour_floor(now) - hour_back * HOUR + (i * 1_799) % HOUR;
            let ts = ts.min(now); // never in the future
            let app = format!("app{}", i % 7);
            let dev = format!("dev{}", i % 13);
            let ip = if i % 5 == 0 {
                "::1".to_string()
            } else {
                format!("10.0.0.{}", i % 3)
            };
            let bytes = 1 + i % 100;
            let payload = format!(
                r#"{{"app_id":"{app}","device_id":"{dev}","ip":"{ip}","ts":{ts},"bytes":{bytes}}}"#
            );
            h.produce((i % 4) as i32, payload.as_bytes(), None);
            n += 1;

            truth.add(ts, &app, &dev, &ip, bytes);
        }
    }
    n
}

/// Every key and its expiry time in Redis, against the truth.
fn stored_keys_are_the_truth(h: &Harness, want: &BTreeMap<String, (i64, i64)>) {
    let mut got: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut conn = h.conn();
    for pattern in ["flow:*", "daily:*", "minute:*", "bytes:*"] {
        for (k, v) in h.dump(pattern) {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(&mut conn).unwrap();
            got.insert(k, (v, at));
        }
    }
    // Minute windows that already ended more than a day ago are late; none here, so all must match.
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(5)
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "key sets differ; missing {missing:?}"
    );
    for (k, &(count, at)) in want {
        // Stored: window end + retention spread by the key's hash, within the default spread
        // (every counter here lives over 50 min: 5 min).
        let stored = stored_expire_at(k.as_bytes(), at, 300_000);
        assert!((at..=at + 300_000).contains(&stored));
        assert_eq!(got.get(k), Some(&(count, stored)), "key {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_events_are_counted_as_late_and_not_written() {
    let mut h = Harness::new("late", 1);
    let config = h.config(
        "g-late",
        vec![counter(
            "flow",
            &["app_id"],
            "late:{app_id}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    let now = Utc::now().timestamp_millis();
    for i in 0..10 {
        // Two hours ago, with zero retention: the window has expired.
        h.produce(
            0,
            format!(r#"{{"app_id":"old{i}"}}"#).as_bytes(),
            Some(now - 2 * HOUR),
        );
    }
    for _ in 0..5 {
        h.produce(0, br#"{"app_id":"fresh"}"#, Some(now));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-late", Duration::from_secs(60)).await;
    let m = running.metrics.clone();
    wait_for("late metric", Duration::from_secs(10), || {
        m.aggregate.late_events.with_label_values(&["flow"]).get() == 10
    })
    .await;
    running.stop().await;
    let keys = h.dump("late:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys.values().next(), Some(&5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_cannot_collide_or_escape_the_key_format() {
    let mut h = Harness::new("hostile", 1);
    let config = h.config(
        "g-hostile",
        vec![counter(
            "c",
            &["a", "b"],
            "h:{a}:{b}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    let now = Utc::now().timestamp_millis();
    // Without escaping, ("x:y","z") and ("x","y:z") would share the key h:x:y:z:<hour>.
    for (a, b) in [
        ("x:y", "z"),
        ("x", "y:z"),
        ("{tag}", "%3A"),
        ("\n", "\u{7f}"),
    ] {
        let payload = serde_json::json!({ "a": a, "b": b }).to_string();
        h.produce(0, payload.as_bytes(), Some(now));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-hostile", Duration::from_secs(60)).await;
    running.stop().await;
    let keys = h.dump("h:*");
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(keys.values().all(|&v| v == 1));
    assert!(keys
        .keys()
        .all(|k| !k.contains('{') && !k.contains('}') && !k.contains('\n')));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_without_expiry_are_repaired() {
    let mut h = Harness::new("repair", 1);
    let mut config = h.config(
        "g-repair",
        vec![counter(
            "c",
            &["app_id"],
            "rep:{app_id}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    config.flush.ttl_check_every = 1;
    let now = Utc::now().timestamp_millis();
    let hour = Utc.timestamp_millis_opt(now).unwrap().format("%Y%m%d%H");
    let key = format!("rep:a:{hour}");
    // Someone created the key without an expiry (e.g. a hand-written INCR).
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(5)
        .query(&mut h.conn())
        .unwrap();
    for _ in 0..3 {
        h.produce(0, br#"{"app_id":"a"}"#, Some(now));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-repair", Duration::from_secs(60)).await;
    running.stop().await;
    let mut conn = h.conn();
    let value: i64 = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut conn)
        .unwrap();
    assert_eq!(value, 8);
    assert_eq!(
        at,
        stored_expire_at(key.as_bytes(), hour_floor(now) + HOUR, 300_000),
        "expiry repaired to the window end, spread as the flush spreads it"
    );
}
