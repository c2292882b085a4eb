//! The status page in a real headless Chromium and `tally top` in tmux, against tally on the
//! mock broker and a real redis-server: what they show is checked against what was produced
//! (lag, counts per second, the five hottest keys, rate-limit decisions), then a partition is
//! halted (its applied offset deleted) and the page must name it with the repair command.

mod browser;

use std::time::{Duration, Instant};

use tally_testkit::http::Client;
use tally_testkit::local_redis::free_port;

use crate::common::terminal::{self, start_top, tmux};
use crate::common::{hourly, Harness, Running};

const TOKEN: &str = "s3cret-status";
const WAIT: Duration = Duration::from_secs(90);

/// Events per app: five heavy ones, then twenty light ones (5 each).
fn weights() -> Vec<(String, usize)> {
    let heavy = [60, 45, 30, 20, 12];
    (0..25)
        .map(|i| (format!("a{i}"), heavy.get(i).copied().unwrap_or(5)))
        .collect()
}

/// tally with a token and a rate-limit policy `per_user` (3 a minute), on `port`.
fn start(h: &Harness, group: &str, port: u16) -> Running {
    let mut counters = hourly("sp");
    // An output, so the page shows the watermarks (this process leads the publisher). Idle
    // after an hour: the partitions keep holding the watermark for the whole test.
    h.mock.create_topic("sp-hourly", 1, 1).unwrap();
    counters[0].output = Some(tally_counters::config::OutputConfig {
        allowed_lateness: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(3600),
        ..tally_counters::config::OutputConfig::to("sp-hourly")
    });
    let mut config = h.config(group, counters);
    config.http.listen = format!("127.0.0.1:{port}");
    config.http.token = Some(TOKEN.into());
    let policy =
        serde_json::json!({"name": "per_user", "algorithm": "fixed", "limit": 3, "window": "1m"});
    config
        .request
        .limits
        .push(serde_json::from_value(policy).unwrap());
    let running = h.start(config);
    running
        .metrics
        .status
        .set_config_path(std::path::Path::new("/etc/tally/tally.toml"));
    running
}

/// Produce every app's events round-robin over the partitions; returns how many, and their
/// event time.
fn produce(h: &mut Harness) -> (usize, i64) {
    let now = chrono::Utc::now().timestamp_millis();
    let mut n = 0;
    for (app, count) in weights() {
        for _ in 0..count {
            let payload = format!(r#"{{"app_id":"{app}","device_id":"d0"}}"#);
            h.produce((n % 2) as i32, payload.as_bytes(), Some(now));
            n += 1;
        }
    }
    h.flush_producer();
    (n, now)
}

/// A Unix-ms time as the page shows it: `HH:MM:SSZ`.
fn time_of_day(ms: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
    t.format("%H:%M:%SZ").to_string()
}

/// Five calls of `per_user` for one subject: 3 admitted, 2 denied.
fn limit_calls(port: u16) {
    let client = Client::default();
    let auth = format!("Bearer {TOKEN}");
    for _ in 0..5 {
        let answer = client
            .post_with(
                port,
                "/v1/limit",
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                r#"{"policy":"per_user","subject":"alice"}"#,
            )
            .expect("tally answers");
        assert!(matches!(answer.status, 200 | 429), "{answer:?}");
    }
}

/// The page's DOM, again and again, until `done` accepts it; a screenshot under `target/` and
/// a panic with the last DOM otherwise.
async fn page_until(url: &str, what: &str, done: impl Fn(&str) -> Result<(), String>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let u = url.to_string();
        let dom =
            tokio::task::spawn_blocking(move || browser::dump_dom(&u, Duration::from_millis(2500)))
                .await
                .unwrap();
        let verdict = done(&dom);
        if verdict.is_ok() {
            return dom;
        }
        if Instant::now() > deadline {
            let shot = browser::screenshot(url, "status-page-failure");
            panic!(
                "the page never showed {what}: {}\nscreenshot: {}\n{dom}",
                verdict.unwrap_err(),
                shot.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn expect(got: Option<String>, want: &str, what: &str) -> Result<(), String> {
    match got {
        Some(g) if g == want => Ok(()),
        other => Err(format!("{what}: {other:?}, want {want}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_lag_rates_hot_keys_decisions_and_a_halted_partition() {
    let mut h = Harness::new("status-page", 2);
    let group = "g-status-page";
    let port = free_port().unwrap();
    let running = start(&h, group, port);
    let started = Instant::now();
    let (n, produced_at) = produce(&mut h);
    h.wait_applied(group, WAIT).await;
    tokio::task::spawn_blocking(move || limit_calls(port))
        .await
        .unwrap();

    // The token travels in the fragment (never sent to the server); the page keeps it.
    let url = format!("http://127.0.0.1:{port}/#token={TOKEN}");
    let hour = chrono::Utc::now().format("%Y%m%d%H").to_string();
    let top5: Vec<Vec<String>> = weights()[..5]
        .iter()
        .map(|(app, count)| vec![format!("sp:{app}:d0:{hour}"), count.to_string()])
        .collect();
    let dom = page_until(&url, "the stream's figures", |dom| {
        expect(
            browser::text_of(dom, "totals")
                .map(|t| t.split(" / ").next().unwrap_or("").to_string()),
            &n.to_string(),
            "consumed",
        )?;
        expect(browser::text_of(dom, "lag"), "0", "lag")?;
        let hot = browser::table(dom, "hot-keys");
        if hot.get(..5) != Some(&top5[..]) {
            return Err(format!("hot keys {hot:?}, want first {top5:?}"));
        }
        let policies = browser::table(dom, "policies");
        if policies != [["per_user", "3", "2", "0"]] {
            return Err(format!("policies {policies:?}"));
        }
        // Each partition's watermark is the event time produced; the counter's is a minute
        // (its allowed lateness) before.
        let marks: Vec<String> = browser::table(dom, "partitions")
            .into_iter()
            .map(|row| row.get(5).cloned().unwrap_or_default())
            .collect();
        if marks != [time_of_day(produced_at), time_of_day(produced_at)] {
            return Err(format!(
                "watermarks {marks:?}, want {}",
                time_of_day(produced_at)
            ));
        }
        let closed = format!("flow closed up to {}", time_of_day(produced_at - 60_000));
        expect(browser::text_of(dom, "outputs"), &closed, "output")?;
        Ok(())
    })
    .await;
    // Counts per second over the last minute add up to what was produced.
    if started.elapsed() < Duration::from_secs(55) {
        assert_eq!(
            browser::text_of(&dom, "consumed-minute"),
            Some(n.to_string()),
            "{dom}"
        );
    }
    assert!(dom.contains(">ready<"), "{dom}");
    // Health in words, not colour alone; which process this is.
    assert!(
        dom.contains(">kafka: up<") && dom.contains(">redis: up<"),
        "{dom}"
    );
    let instance = browser::text_of(&dom, "instance").unwrap_or_default();
    assert!(
        instance.contains(&format!("tally {}", env!("CARGO_PKG_VERSION")))
            && instance.contains(&format!("group {group}"))
            && instance.contains(&format!("topic {}", h.topic)),
        "{instance}"
    );
    assert!(
        dom.contains("<div id=\"halted\"></div>"),
        "nothing halted: {dom}"
    );

    // What is not counted is shown: 3 undecodable messages and 2 events of a window long gone.
    let long_ago = chrono::Utc::now().timestamp_millis() - 3 * 86_400_000;
    for _ in 0..3 {
        h.produce(0, b"not json", None);
    }
    for _ in 0..2 {
        h.produce(0, br#"{"app_id":"a0","device_id":"d0"}"#, Some(long_ago));
    }
    h.flush_producer();
    page_until(&url, "invalid and late", |dom| {
        expect(browser::text_of(dom, "skipped"), "3 / 2", "not counted")
    })
    .await;

    // Partition 1's applied offset disappears; its next events cannot be counted safely.
    let fence = format!("tally:applied:{group}:{}:1:0", h.topic);
    let _: () = redis::cmd("DEL").arg(&fence).query(&mut h.conn()).unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    for _ in 0..7 {
        h.produce(1, br#"{"app_id":"a0","device_id":"d0"}"#, Some(now));
    }
    h.flush_producer();
    let repair = "tally state --config /etc/tally/tally.toml repair --partition 1";
    let dom = page_until(&url, "the halted partition", |dom| {
        if !dom.contains(&format!("<code class=\"repair\">{repair}</code>")) {
            return Err("no repair command".into());
        }
        expect(browser::text_of(dom, "lag"), "7", "lag")
    })
    .await;
    assert!(dom.contains("data-partition=\"1\""), "{dom}");
    assert!(dom.contains("fence_missing"), "{dom}");
    assert!(dom.contains(">not ready<"), "{dom}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tally_top_draws_the_status_in_a_terminal_and_quits_on_q() {
    let mut h = Harness::new("status-top", 2);
    let group = "g-status-top";
    let port = free_port().unwrap();
    let running = start(&h, group, port);
    let (_, produced_at) = produce(&mut h);
    h.wait_applied(group, WAIT).await;
    let socket = format!("tally-top-{}", std::process::id());
    let command = format!(
        "TALLY_TOKEN={TOKEN} {} top http://127.0.0.1:{port}",
        env!("CARGO_BIN_EXE_tally")
    );
    start_top(&socket, &command);
    let hour = chrono::Utc::now().format("%Y%m%d%H").to_string();
    let hottest = format!("sp:a0:d0:{hour}");
    let deadline = Instant::now() + WAIT;
    let screen = loop {
        let screen = terminal::screen(&socket);
        let hot_line = screen.lines().find(|l| l.contains(&hottest)).unwrap_or("");
        // The watermarks come with the publisher's passes (this process leads it).
        let marks = format!("watermark  p0:{at} p1:{at}", at = time_of_day(produced_at));
        if screen.contains("ready")
            && hot_line.contains("60")
            && screen.contains("lag 0")
            && screen.contains(&marks)
        {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "tally top never showed the status:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        screen.contains(&format!("http://127.0.0.1:{port}")),
        "{screen}"
    );
    assert!(screen.contains("consumed/s"), "{screen}");
    // Health in words; which process; each partition's lane and offsets.
    for words in [
        "kafka up",
        "redis up",
        &format!("tally {}", env!("CARGO_PKG_VERSION")),
        &format!("group {group}"),
        "partition  lane     applied         end      lag",
    ] {
        assert!(screen.contains(words), "no {words:?}:\n{screen}");
    }
    let applied = h.applied(group, 0).expect("partition 0 applied");
    assert!(
        screen
            .lines()
            .any(|l| l.contains(&format!("  {applied}  ")) && l.contains("counting")),
        "partition 0's applied offset {applied}:\n{screen}"
    );
    // tally stops answering: the last status stays, marked stale.
    running.stop().await;
    let deadline = Instant::now() + WAIT;
    loop {
        let screen = terminal::screen(&socket);
        if screen.contains("STALE since") && screen.contains("consumed/s") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tally top never said stale:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tmux(&socket, &["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&socket, &["has-session", "-t", "top"])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "q did not quit tally top");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tmux(&socket, &["kill-server"]);
}
