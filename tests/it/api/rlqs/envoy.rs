//! Envoy's rate limit quota service (RLQS) through four real Envoys (1.40, filter
//! `envoy.filters.http.rate_limit_quota`) sharing one tally: the limit of 1,000 per
//! minute scaled to 333 per 20 s (so that the test takes about 80 s), uneven traffic (one
//! Envoy takes 60 %), demand six times the limit. Envoy 1.40 reports every 5 s (its filter keeps
//! a fixed interval, whatever `reporting_interval` says). The ground truth is every answer the
//! clients got, by the window its request was sent in: admitted ≤ limit + 5 % in the window
//! (the stated bound is 0 while answers take under 100 ms), against what a server giving every
//! Envoy the whole limit (jukie/rlqs) would have admitted. A fifth Envoy without the filter,
//! under the same kind of traffic, gives the latency to compare with. Then tally is killed:
//! each Envoy keeps its last assignment (its window spent: `DENY_ALL`) until
//! `assignment_ttl`, then its configured `expired_assignment_behavior` (here `ALLOW_ALL`, to
//! see it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitQuotaFilter};
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{limits_dir, Rls};

const LIMIT: u64 = 333;
const WINDOW_MS: i64 = 20_000;
/// Envoy 1.40's report interval (fixed in its filter).
const INTERVAL_MS: i64 = 5_000;
const TTL_S: u64 = 10;
/// Requests per second offered to each Envoy with the filter (60 % to the first), then to the
/// one without.
const RATES: [f64; 5] = [60.0, 14.0, 13.0, 13.0, 25.0];

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn start_envoy(dir: &std::path::Path, name: &str, app: u16, rls: u16, quota: bool) -> Envoy {
    // Answered by Envoy itself: the upstream must outlive tally, which the test kills.
    let route = ["direct_response: {status: 200, body: {inline_string: ok}}"];
    let bootstrap = Bootstrap {
        app,
        rls,
        route: &route,
        rate_limit: None,
        rls_tls: None,
    };
    let filter = RateLimitQuotaFilter {
        domain: "edge",
        bucket_id: &[("name", "shared")],
        reporting_interval_s: (INTERVAL_MS / 1000) as u64,
        behaviors: &[
            "no_assignment_behavior: {fallback_rate_limit: {blanket_rule: DENY_ALL}}",
            "expired_assignment_behavior:",
            "  expired_assignment_behavior_timeout: 60s",
            "  fallback_rate_limit: {blanket_rule: ALLOW_ALL}",
        ],
        token: None,
    }
    .yaml();
    let filter = if quota { filter } else { String::new() };
    Envoy::start(dir, name, 1, |port, admin| {
        bootstrap.yaml_with(port, admin, &filter)
    })
    .unwrap()
}

/// One answer: when its request was sent (Unix ms), through which Envoy, admitted or not, and
/// how long it took.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at_ms: i64,
    envoy: usize,
    admitted: bool,
    took: Duration,
}

/// Requests at `rate`/s through `port` until `stop`.
fn paced(port: u16, envoy: usize, rate: f64, stop: Arc<AtomicBool>) -> Vec<Sent> {
    let client = Client::new(Duration::from_secs(5));
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let (at_ms, sent) = (now_ms(), Instant::now());
        let status = client.get(port, "/", &[]).map_or(0, |a| a.status);
        let took = sent.elapsed();
        assert!(status == 200 || status == 429, "envoy answered {status}");
        out.push(Sent {
            at_ms,
            envoy,
            admitted: status == 200,
            took,
        });
        next += gap;
        // Pacing: the next send time (the clock is the condition here).
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    out
}

fn sleep_until(ms: i64) {
    let wait = ms - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

fn p99<'a>(sent: impl Iterator<Item = &'a Sent>) -> Duration {
    let mut took: Vec<Duration> = sent.map(|s| s.took).collect();
    took.sort_unstable();
    took.get((took.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

#[test]
fn four_envoys_share_one_limit_and_keep_their_assignment_when_tally_stops() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut rls = start(&redis);
    let app = rls.tally.port;
    // Envoy's files apart from the limits directory, which tally reads whole.
    let proxies = limits_dir("rlqs-envoy-proxies");
    let envoys: Vec<Envoy> = (0..5)
        .map(|i| start_envoy(&proxies, &format!("q{i}"), app, rls.port, i < 4))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = envoys
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (port, stop) = (e.port, stop.clone());
            std::thread::spawn(move || paced(port, i, RATES[i], stop))
        })
        .collect();
    // The measured window is the second whole window after the first reports: a report charges
    // the allowed requests it carries to the window it lands in, so the window after the
    // warm-up's (whose grants, sized from the first reports' stale demands, outlive it) is
    // charged with what they admitted before it began. Then tally is killed 10 s into the next
    // window (two reports of every Envoy in it: its budget spent by then).
    let first = (now_ms() + INTERVAL_MS + 2000).div_euclid(WINDOW_MS) * WINDOW_MS + 2 * WINDOW_MS;
    let killed_at = first + WINDOW_MS + 2 * INTERVAL_MS;
    sleep_until(killed_at);
    rls.tally.kill9();
    let ttl_ms = TTL_S as i64 * 1000;
    sleep_until(killed_at + ttl_ms + 3000);
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<Sent> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let logs = || envoys.iter().map(Envoy::log).collect::<Vec<_>>().join("\n");
    the_window_is_shared_by_demand(&sent, first, &logs);
    the_filter_adds_little_latency(&sent, killed_at);
    assignments_hold_until_their_ttl_then_the_fallback(&sent, killed_at, &logs);
}

/// tally with `[rlqs]`: one bucket `shared` of `LIMIT` a window.
fn start(redis: &LocalRedis) -> Rls {
    let dir = limits_dir("rlqs-envoy");
    std::fs::write(dir.join("edge.yaml"), "domain: other\ndescriptors: []\n").unwrap();
    let rlqs = format!(
        "\n[rlqs]\nreport_interval = \"{}s\"\nassignment_ttl = \"{TTL_S}s\"\nabandon_after = \"60s\"\n\
         [[rlqs.buckets]]\ndomain = \"edge\"\nname = \"shared\"\nlimit = {LIMIT}\nwindow = \"{}s\"\n\
         match = {{ name = \"shared\" }}\n",
        INTERVAL_MS / 1000,
        WINDOW_MS / 1000
    );
    Rls::start_with(redis, &dir, "rlqs-envoy", None, &rlqs)
}

/// The measured window: at most the limit (and most of it) admitted, shared by demand.
fn the_window_is_shared_by_demand(sent: &[Sent], first: i64, logs: &dyn Fn() -> String) {
    let (start, end) = (first, first + WINDOW_MS);
    let window: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.envoy < 4 && (start..end).contains(&s.at_ms))
        .collect();
    let admitted = window.iter().filter(|s| s.admitted).count() as u64;
    let per_envoy: Vec<u64> = (0..4)
        .map(|i| {
            let mine = window.iter().filter(|s| s.envoy == i);
            mine.filter(|s| s.admitted).count() as u64
        })
        .collect();
    let offered: Vec<u64> = (0..4)
        .map(|i| window.iter().filter(|s| s.envoy == i).count() as u64)
        .collect();
    // A server handing every Envoy the whole limit lets each admit its own traffic up to it.
    let full: u64 = offered.iter().map(|o| (*o).min(LIMIT)).sum();
    eprintln!(
        "rlqs window of {} s: admitted {admitted} of {} offered (per envoy {per_envoy:?} of \
         {offered:?}); limit {LIMIT}; a full assignment per envoy would admit {full}",
        WINDOW_MS / 1000,
        window.len()
    );
    assert!(
        admitted <= LIMIT + LIMIT / 20,
        "{admitted} admitted for a limit of {LIMIT}\n{}",
        logs()
    );
    assert!(
        admitted >= LIMIT * 8 / 10,
        "only {admitted} admitted (the budget is stranded)\n{}",
        logs()
    );
    assert!(full > 2 * LIMIT, "the traffic is not uneven enough: {full}");
    assert!(
        per_envoy[0] > per_envoy[1] + per_envoy[2] + per_envoy[3],
        "shared by demand: {per_envoy:?}"
    );
}

/// Latency while tally serves: through the filter, and through the Envoy without it.
fn the_filter_adds_little_latency(sent: &[Sent], killed_at: i64) {
    let serving = |s: &&Sent| s.at_ms < killed_at;
    let with = p99(sent.iter().filter(|s| s.envoy < 4).filter(serving));
    let without = p99(sent.iter().filter(|s| s.envoy == 4).filter(serving));
    eprintln!("rlqs p99 through envoy: {with:?} with the filter, {without:?} without");
    assert!(
        with <= without * 2 + Duration::from_millis(5),
        "p99 {with:?} with the filter, {without:?} without"
    );
}

/// Tally killed: each Envoy's last assignment (its window spent: DENY_ALL, or what was left
/// of a grant) holds until its time to live, counted from its last answer (within one report
/// interval before the kill); then the fallback (ALLOW_ALL here) applies.
fn assignments_hold_until_their_ttl_then_the_fallback(
    sent: &[Sent],
    killed_at: i64,
    logs: &dyn Fn() -> String,
) {
    let ttl_ms = TTL_S as i64 * 1000;
    let expiry_from = killed_at + ttl_ms - INTERVAL_MS - 300;
    let held: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.envoy < 4 && (killed_at + 200..expiry_from).contains(&s.at_ms))
        .collect();
    let held_admitted = held.iter().filter(|s| s.admitted).count();
    eprintln!(
        "rlqs after tally stopped, before any expiry: {held_admitted} admitted of {}",
        held.len()
    );
    assert!(
        held.len() > 50 && held_admitted <= 10,
        "{held_admitted} of {}\n{}",
        held.len(),
        logs()
    );
    for i in 0..4 {
        let after: Vec<&Sent> = sent
            .iter()
            .filter(|s| s.envoy == i && s.at_ms >= killed_at + 200)
            .collect();
        // The fallback starts after the last denial.
        let last_denied = after.iter().rev().find(|s| !s.admitted).map(|s| s.at_ms);
        let switched = last_denied.map_or(0, |t| t - killed_at);
        eprintln!("rlqs envoy {i}: the fallback applies {switched} ms after tally stopped");
        assert!(
            last_denied.is_some_and(|t| t >= expiry_from - 200 && t <= killed_at + ttl_ms + 500),
            "envoy {i}: last denial {switched} ms after the kill (ttl {ttl_ms} ms)\n{}",
            logs()
        );
        let fallback = after
            .iter()
            .filter(|s| s.at_ms > killed_at + ttl_ms + 500)
            .count();
        assert!(
            fallback >= 20,
            "envoy {i}: {fallback} requests after expiry"
        );
    }
}
