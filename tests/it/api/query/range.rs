//! Range queries (sliding windows over tumbling buckets) checked against a truth computed from
//! the produced events, over many bucket boundaries; the batch form; the HTTP errors.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::common::stream::{Stream, COUNTERS};
use crate::common::Harness;
use chrono::{TimeZone, Utc};
use tally::api::query::{Query, Span};
use tally_testkit::http;

const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;

fn dims(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_match_the_events_across_bucket_boundaries() {
    let s = Stream {
        n: 30_000,
        partitions: 4,
        now_ms: Utc::now().timestamp_millis(),
    };
    let (_counted, config) = count(&s).await;
    let model = tally::config::Model::compile(config.clone()).unwrap();
    let query = Query::new(model.clone(), tally::app::request_client(&model).unwrap());
    minutes_match_the_events(&query, &s).await;
    distinct_devices_are_the_union_of_the_hours(&query, &s).await;
    the_batch_form_answers_every_app(&query, &s).await;

    // Over HTTP, with its errors.
    let (port, stop) = serve_http(&config, query).await;
    let ip = s.event(0).ip().to_string();
    let app = s.event(0).app().to_string();
    http_answers_and_refuses(port, &ip);
    leaderboards_sum_the_scores(port, &s, &app);
    hostile_times_and_counts_are_answered(port);
    stop.cancel();
}

/// The stream's events counted by the counters of `COUNTERS`; the harness (its Redis holds the
/// counts) and the configuration.
async fn count(s: &Stream) -> (Harness, tally::config::Config) {
    #[derive(serde::Deserialize)]
    struct Parsed {
        decode: tally::config::DecodeConfig,
        counters: Vec<tally::config::CounterConfig>,
    }
    let mut h = Harness::new("ranges", 4);
    for i in 0..s.n {
        let e = s.event(i);
        h.produce(e.partition, e.payload.as_bytes(), None);
    }
    h.flush_producer();
    let parsed: Parsed = toml::from_str(COUNTERS).unwrap();
    let mut config = h.config("g-ranges", parsed.counters);
    config.decode = parsed.decode;
    let running = h.start(config.clone());
    h.wait_applied("g-ranges", Duration::from_secs(120)).await;
    running.stop().await;
    (h, config)
}

/// "minute" counts events per ip per minute: the last 90 minutes, and a 2-hour range with
/// boundaries inside minutes, against the events themselves.
async fn minutes_match_the_events(query: &Query, s: &Stream) {
    let ip = s.event(0).ip().to_string();
    let per_minute = |from: i64, to: i64| -> (BTreeMap<i64, i64>, i64) {
        let mut m = BTreeMap::new();
        for i in 0..s.n {
            let e = s.event(i);
            let bucket = e.ts().div_euclid(MINUTE) * MINUTE;
            if e.ip() == ip && bucket >= from.div_euclid(MINUTE) * MINUTE && bucket <= to {
                *m.entry(bucket).or_insert(0) += 1;
            }
        }
        let total = m.values().sum();
        (m, total)
    };
    let now = s.now_ms;
    for span in [
        Span::Last(90),
        Span::Between(now - 2 * HOUR - 17_000, now - 5 * MINUTE + 1),
    ] {
        let answer = query
            .range("minute", &[dims(&[("ip", &ip)])], span, now)
            .await
            .unwrap()
            .remove(0);
        let (first, last) = (
            answer.windows[0].start_ms,
            answer.windows.last().unwrap().start_ms,
        );
        let (want, total) = per_minute(first, last);
        assert!(answer.windows.len() >= 90, "{}", answer.windows.len());
        for w in &answer.windows {
            assert_eq!(w.end_ms - w.start_ms, MINUTE);
            assert_eq!(
                w.value,
                want.get(&w.start_ms).copied(),
                "minute {}",
                w.start_ms
            );
        }
        assert_eq!(answer.value, Some(total), "{span:?}");
        assert!(total > 0);
    }
}

/// Distinct devices per app over the last 3 hours: the exact union of three hourly sets.
async fn distinct_devices_are_the_union_of_the_hours(query: &Query, s: &Stream) {
    let now = s.now_ms;
    let app = s.event(0).app().to_string();
    let answer = query
        .range("uniq", &[dims(&[("app_id", &app)])], Span::Last(3), now)
        .await
        .unwrap()
        .remove(0);
    let since = now.div_euclid(HOUR) * HOUR - 2 * HOUR;
    let union: BTreeSet<String> = (0..s.n)
        .map(|i| s.event(i))
        .filter(|e| e.app() == app && e.ts() >= since)
        .map(|e| e.device().to_string())
        .collect();
    assert_eq!(answer.value, Some(union.len() as i64));
    let hll = query
        .range("uniq_hll", &[dims(&[("app_id", &app)])], Span::Last(3), now)
        .await
        .unwrap()
        .remove(0);
    let estimate = hll.value.expect("merged in Redis (one slot per series)") as f64;
    let exact = union.len() as f64;
    assert!(
        (estimate - exact).abs() <= 3.0 * 0.0081 * exact + 1.0,
        "{estimate} vs {exact}"
    );
    let hourly = answer.windows.iter().filter_map(|w| w.value).sum::<i64>();
    assert!(
        hourly > union.len() as i64,
        "a device seen in two hours counts once in the union"
    );
}

/// The batch form: every app at once, one pipeline.
async fn the_batch_form_answers_every_app(query: &Query, s: &Stream) {
    let now = s.now_ms;
    let apps: Vec<BTreeMap<String, String>> = (0..7)
        .map(|a| dims(&[("app_id", &format!("app{a}"))]))
        .collect();
    let answers = query
        .range("daily", &apps, Span::At(now), now)
        .await
        .unwrap();
    let day = |t: i64| {
        let local = Utc
            .timestamp_millis_opt(t)
            .unwrap()
            .with_timezone(&chrono_tz::Asia::Shanghai);
        local.date_naive()
    };
    for (a, answer) in answers.iter().enumerate() {
        let want = (0..s.n)
            .map(|i| s.event(i))
            .filter(|e| e.app() == format!("app{a}") && day(e.ts()) == day(now))
            .count() as i64;
        assert_eq!(answer.value, Some(want), "app{a}");
    }
}

/// The HTTP port answering from `query`; its port and its stop token.
async fn serve_http(
    config: &tally::config::Config,
    query: Query,
) -> (u16, tokio_util::sync::CancellationToken) {
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut http = config.http.clone();
    http.listen = format!("127.0.0.1:{port}");
    let stop = tokio_util::sync::CancellationToken::new();
    let metrics = tally::ops::metrics::Metrics::new(&[]);
    tally::api::http::serve(
        &http,
        metrics,
        Arc::new(Default::default()),
        Some(Arc::new(query)),
        None,
        Default::default(),
        stop.clone(),
    )
    .await
    .unwrap();
    (port, stop)
}

/// A range over HTTP, and the errors of bad ones.
fn http_answers_and_refuses(port: u16, ip: &str) {
    let (code, body) = http::get(port, &format!("/v1/counters/minute?ip={ip}&last=90")).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["windows"].as_array().unwrap().len(), 90);
    for (path, why) in [
        ("/v1/counters/nope?ip=1", "unknown counter"),
        ("/v1/counters/minute", "missing dimension"),
        ("/v1/counters/minute?ip=1&x=2", "not a dimension"),
        ("/v1/counters/minute?ip=1&last=100000", "at most"),
        (
            "/v1/counters/minute?ip=1&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
            "after",
        ),
        (
            "/v1/counters/minute?ip=1&from=2020-01-01T00:00:00Z&to=2026-01-01T00:00:00Z",
            "more than",
        ),
        ("/v1/counters/minute?ip=1&window=yesterday", "bad time"),
        ("/v1/counters/minute?ip=1&last=3&window=current", "one of"),
        ("/v1/counters/top?app_id=app0&top=0", "top must be"),
        ("/v1/counters/top?app_id=app0&top=x", "top must be"),
    ] {
        let (code, body) = http::get(port, path).unwrap();
        assert_eq!(code, 400, "{path}: {body}");
        assert!(body.contains(why), "{path}: {body}");
    }
}

/// Leaderboards list the best `top` members over the range, scores summed.
fn leaderboards_sum_the_scores(port: u16, s: &Stream, app: &str) {
    let now = s.now_ms;
    let (code, body) =
        http::get(port, &format!("/v1/counters/top?app_id={app}&last=3&top=3")).unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let since = now.div_euclid(HOUR) * HOUR - 2 * HOUR;
    let mut scores: BTreeMap<String, i64> = BTreeMap::new();
    for e in (0..s.n)
        .map(|i| s.event(i))
        .filter(|e| e.app() == app && e.ts() >= since)
    {
        *scores.entry(e.device().to_string()).or_default() += e.bytes();
    }
    let mut best: Vec<i64> = scores.values().copied().collect();
    best.sort_unstable_by(|a, b| b.cmp(a));
    let got: Vec<i64> = v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_i64().unwrap())
        .collect();
    assert_eq!(got, best[..3].to_vec());
    assert_eq!(v["value"].as_i64(), Some(scores.len() as i64));
}

/// Hostile times and counts are answered, never a panic.
fn hostile_times_and_counts_are_answered(port: u16) {
    for path in [
        "/v1/counters/minute?ip=1&window=-9223372036854775808",
        "/v1/counters/minute?ip=1&window=9223372036854775807",
        "/v1/counters/minute?ip=1&from=-9223372036854775808&to=9223372036854775807",
        "/v1/counters/minute?ip=1&last=18446744073709551616",
    ] {
        let (code, body) = http::get(port, path).unwrap();
        assert!(code == 200 || code == 400, "{path}: {code} {body}");
    }
}
