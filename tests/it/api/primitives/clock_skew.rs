//! Redis' clock, not the host's, decides when a quota's or a pool's state expires: `tally serve`
//! runs with its clock two hours behind (libfaketime, Debian's `faketime`), and a quota of 2 with
//! a 30-minute ttl still sells exactly 2, a filled pool still hands out its items. With expiries
//! computed on the host (`now + ttl`, two hours in the past for Redis) every write expired at
//! once: the quota sold on and on, the pool was empty right after its fill.

use std::time::Duration;

use tally_testkit::http::{Answer, Client};
use tally_testkit::local_redis::LocalRedis;

use crate::common::process::TallyProcess;
use crate::common::wait_for;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn config(redis: &LocalRedis) -> String {
    format!(
        r#"
[redis]
url = "{}"
[[request.quotas]]
name = "flash"
size = 2
ttl = "30m"
[[request.pools]]
name = "codes"
ttl = "30m"
"#,
        redis.url()
    )
}

fn post(port: u16, path: &str, body: &str) -> Answer {
    Client::default()
        .post_with(port, path, &[("Content-Type", "application/json")], body)
        .expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiries_follow_redis_time_when_the_host_clock_is_behind() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} missing: scripts/setup.sh installs faketime"
    );
    let redis = LocalRedis::start(&[]).unwrap();
    let env = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", "-2h"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let p = TallyProcess::start_command_with_env("serve", &config(&redis), "skew", "", &env);
    wait_for("tally serve ready", Duration::from_secs(30), || {
        tally_testkit::http::get(p.port, "/health/ready").is_some_and(|(code, _)| code == 200)
    })
    .await;
    let port = p.port;
    let (takes, claimed) = tokio::task::spawn_blocking(move || {
        let takes: Vec<String> = (0..3)
            .map(|_| {
                let a = post(port, "/v1/quota", r#"{"quota":"flash"}"#);
                assert_eq!(a.status, 200, "{}", a.body);
                let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
                v["outcome"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        let fill = post(
            port,
            "/v1/pool",
            r#"{"pool":"codes","items":["c1"],"action":"fill"}"#,
        );
        assert_eq!(fill.status, 200, "{}", fill.body);
        let claim = post(port, "/v1/pool", r#"{"pool":"codes","user":"alice"}"#);
        assert_eq!(claim.status, 200, "{}", claim.body);
        (takes, claim.body)
    })
    .await
    .unwrap();
    assert_eq!(
        takes,
        ["admitted", "admitted", "sold_out"],
        "a quota of 2 sells 2 whatever the host's clock says"
    );
    assert!(
        claimed.contains("c1"),
        "the filled item is handed out: {claimed}"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(tally_keys(&redis, "*quota*taken*"))
        .query(&mut connection(&redis))
        .unwrap();
    assert!(
        (1_700_000..=1_800_000).contains(&ttl),
        "the quota lives its 30 minutes by Redis' clock: PTTL {ttl} ms"
    );
    assert!(!p.log().contains("panicked"), "{}", p.log());
}

fn connection(redis: &LocalRedis) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The one key matching `pattern`.
fn tally_keys(redis: &LocalRedis, pattern: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut connection(redis))
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys.into_iter().next().unwrap()
}
