//! Keys many subjects share a window boundary for (once markers, fixed and sliding-counter
//! limits) expire spread past it: each within [boundary, boundary + the default spread], as
//! `model::stored_expire_at` of its key, and not all in one instant.

use std::collections::BTreeSet;
use std::time::Duration;

use tally_counters::model::{default_spread_ms, stored_expire_at};
use tally_counters::request::{Algorithm, Once, RateLimiter};
use tally_counters::window::WindowSpec;

use super::limits::policy;
use super::support::{clients, node, Deployment};

/// Every key matching `pattern` on any node, with its PEXPIRETIME.
async fn expiries(dep: &Deployment, pattern: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for url in dep.urls() {
        let mut c = node(&url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut c)
            .await
            .unwrap();
        for key in keys {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            out.push((key, at));
        }
    }
    out
}

/// Each key's expiry is `boundary(key)` spread by `spread` exactly as the model spreads it, and
/// the keys do not share one instant.
fn assert_spread(got: &[(String, i64)], n: usize, spread: i64, boundary: impl Fn(i64) -> i64) {
    assert_eq!(got.len(), n, "{got:?}");
    for (key, at) in got {
        let b = boundary(*at);
        assert!(
            (b..=b + spread).contains(at),
            "{key}: {at} not in [{b}, +{spread}]"
        );
        assert_eq!(*at, stored_expire_at(key.as_bytes(), b, spread), "{key}");
    }
    let instants: BTreeSet<i64> = got.iter().map(|g| g.1).collect();
    assert!(
        instants.len() > n * 8 / 10,
        "{} instants of {n}",
        instants.len()
    );
}

pub async fn boundary_keys_expire_spread(dep: &Deployment) {
    let c = clients(dep, 1).remove(0);
    let day = WindowSpec::new(Duration::from_secs(86_400), chrono_tz::UTC).unwrap();
    let once = Once::new(c.clone(), "spreadday", day);
    for i in 0..40 {
        assert!(once.first(&format!("s{i}"), None).await.unwrap());
    }
    let day_end = day.window_of(chrono::Utc::now().timestamp_millis()).end_ms;
    let got = expiries(dep, "*once*spreadday*").await;
    assert_spread(&got, 40, default_spread_ms(86_400_000), |_| day_end);

    // A 60 s fixed window: the state expires at the window's end, spread by up to 6 s.
    let window = 60_000;
    let limiter = RateLimiter::new(
        c.clone(),
        vec![policy("spreadfixed", Algorithm::Fixed, 100, window as u64)],
    )
    .unwrap();
    for i in 0..40 {
        limiter
            .check(&["spreadfixed"], &format!("s{i}"), 1)
            .await
            .unwrap();
    }
    let spread = default_spread_ms(window);
    let got = expiries(dep, "*spreadfixed*").await;
    // The window the key was written in ends at the first boundary at or after expiry - spread.
    assert_spread(&got, 40, spread, |at| {
        (at - spread + window - 1).div_euclid(window) * window
    });
}
