//! Envoy's rate limit quota service (RLQS) through four real Envoys (1.40, filter
//! `envoy.filters.http.rate_limit_quota`) sharing one tally: one global limit of 200 per 10 s
//! (a shorter window than the 1,000 per minute, so that the test takes under a minute),
//! uneven traffic (one Envoy takes 60 %), demand five times the limit. The ground truth is
//! every answer the clients got, by the window its request was sent in: admitted ≤ limit + 5 %
//! in every window (the stated bound is 0 while answers take under 100 ms), against what a
//! server giving every Envoy the whole limit (jukie/rlqs) would have admitted. Then tally is
//! killed: each Envoy keeps its last assignment until `assignment_ttl`, then its configured
//! `expired_assignment_behavior` (here ALLOW_ALL, to see it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitQuotaFilter};
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;

use super::rls::{limits_dir, Rls};

const LIMIT: u64 = 200;
const WINDOW_MS: i64 = 10_000;
const TTL_S: u64 = 3;
/// Requests per second offered to each Envoy: 60 % to the first.
const RATES: [f64; 4] = [60.0, 14.0, 13.0, 13.0];

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn start_envoy(dir: &std::path::Path, name: &str, app: u16, rls: u16) -> Envoy {
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
        reporting_interval_s: 1,
        behaviors: &[
            "no_assignment_behavior: {fallback_rate_limit: {blanket_rule: DENY_ALL}}",
            "expired_assignment_behavior:",
            "  expired_assignment_behavior_timeout: 60s",
            "  fallback_rate_limit: {blanket_rule: ALLOW_ALL}",
        ],
        token: None,
    }
    .yaml();
    Envoy::start(dir, name, 1, |port, admin| {
        bootstrap.yaml_with(port, admin, &filter)
    })
    .unwrap()
}

/// One answer: when its request was sent (Unix ms), through which Envoy, admitted or not.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at_ms: i64,
    envoy: usize,
    admitted: bool,
}

/// Requests at `rate`/s through `port` until `stop`.
fn paced(port: u16, envoy: usize, rate: f64, stop: Arc<AtomicBool>) -> Vec<Sent> {
    let client = Client::new(Duration::from_secs(5));
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut next = std::time::Instant::now();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let at_ms = now_ms();
        let status = client.get(port, "/", &[]).map_or(0, |a| a.status);
        assert!(status == 200 || status == 429, "envoy answered {status}");
        out.push(Sent {
            at_ms,
            envoy,
            admitted: status == 200,
        });
        next += gap;
        // Pacing: the next send time (the clock is the condition here).
        std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
    }
    out
}

fn sleep_until(ms: i64) {
    let wait = ms - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

#[test]
fn four_envoys_share_one_limit_and_keep_their_assignment_when_tally_stops() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("rlqs-envoy");
    std::fs::write(dir.join("edge.yaml"), "domain: other\ndescriptors: []\n").unwrap();
    let rlqs = format!(
        "\n[rlqs]\nreport_interval = \"1s\"\nassignment_ttl = \"{TTL_S}s\"\nabandon_after = \"60s\"\n\
         [[rlqs.buckets]]\ndomain = \"edge\"\nname = \"shared\"\nlimit = {LIMIT}\nwindow = \"10s\"\n\
         match = {{ name = \"shared\" }}\n"
    );
    let mut rls = Rls::start_with(&redis, &dir, "rlqs-envoy", None, &rlqs);
    let app = rls.tally.port;
    let envoys: Vec<Envoy> = (0..4)
        .map(|i| start_envoy(&dir, &format!("q{i}"), app, rls.port))
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
    // Two whole windows after a warm-up of 3 s (the first reports measure the demand), then
    // tally is killed 4 s into the next window (its budget spent by then).
    let first = (now_ms() + 3000).div_euclid(WINDOW_MS) * WINDOW_MS + WINDOW_MS;
    let killed_at = first + 2 * WINDOW_MS + 4000;
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

    let mut admitted_total = 0;
    for w in 0..2 {
        let (start, end) = (first + w * WINDOW_MS, first + (w + 1) * WINDOW_MS);
        let window: Vec<&Sent> = sent
            .iter()
            .filter(|s| (start..end).contains(&s.at_ms))
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
            "rlqs window {w}: admitted {admitted} of {} offered (per envoy {per_envoy:?} of \
             {offered:?}); limit {LIMIT}; a full assignment per envoy would admit {full}",
            window.len()
        );
        assert!(
            admitted <= LIMIT + LIMIT / 20,
            "window {w}: {admitted} admitted for a limit of {LIMIT}\n{}",
            logs()
        );
        assert!(
            admitted >= LIMIT * 8 / 10,
            "window {w}: only {admitted} admitted (the budget is stranded)"
        );
        assert!(full > 2 * LIMIT, "the traffic is not uneven enough: {full}");
        assert!(
            per_envoy[0] > per_envoy[1] + per_envoy[2] + per_envoy[3],
            "shared by demand: {per_envoy:?}"
        );
        admitted_total += admitted;
    }
    assert!(admitted_total > 0);

    // Tally killed: the last assignment (its window spent: DENY_ALL, or what was left of a
    // grant) holds until its time to live, then the fallback (ALLOW_ALL here) applies.
    let between = |from: i64, to: i64| -> (usize, usize) {
        let s: Vec<&Sent> = sent
            .iter()
            .filter(|s| (killed_at + from..killed_at + to).contains(&s.at_ms))
            .collect();
        (s.iter().filter(|s| s.admitted).count(), s.len())
    };
    let (held, held_of) = between(200, ttl_ms - 1200);
    eprintln!("rlqs after tally stopped, before expiry: {held} admitted of {held_of}");
    assert!(
        held_of > 50 && held <= 10,
        "{held} of {held_of}\n{}",
        logs()
    );
    let (fallback, fallback_of) = between(ttl_ms + 500, ttl_ms + 3000);
    eprintln!("rlqs after expiry: {fallback} admitted of {fallback_of} (fallback ALLOW_ALL)");
    assert!(fallback_of > 50, "{fallback_of} requests after expiry");
    assert_eq!(fallback, fallback_of, "expired_assignment_behavior applies");
}
