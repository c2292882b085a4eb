//! The HTTP endpoint defends itself: half-sent requests are cut at the header timeout while
//! health keeps answering, connections beyond the limit are refused, `/v1/*` needs the bearer
//! token when one is set, a request stuck on Redis is answered at the request timeout, and a
//! client that does not read its answers loses its connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::common::{counter, wait_for, Harness};
use tally::config::HttpConfig;
use tally::ops::metrics::Metrics;
use tally_testkit::http;

/// The HTTP server alone (no Kafka, no Redis), on a free loopback port.
async fn server(config: HttpConfig) -> (u16, CancellationToken) {
    let stop = CancellationToken::new();
    let config = HttpConfig {
        listen: "127.0.0.1:0".into(),
        ..config
    };
    let (addr, _) = tally::api::http::serve(
        &config,
        Metrics::new(&[]),
        Arc::new(Default::default()),
        None,
        None,
        tally::config::Tokens {
            token: config.bearer_token().expect("token"),
            admin: config.admin_token.clone(),
        },
        stop.clone(),
    )
    .await
    .expect("http server starts");
    (addr.port(), stop)
}

/// Read until the server closes `conn` (EOF or reset); what it sent, or None if still open
/// after `limit`.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 512];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read).await.ok()?;
    Some(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_at_the_header_timeout_while_health_answers() {
    let header_timeout = Duration::from_secs(1);
    let (port, stop) = server(HttpConfig {
        header_timeout,
        ..HttpConfig::default()
    })
    .await;
    let opened = Instant::now();
    let mut conns = Vec::new();
    for i in 0..55 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // 50 send half a request (no blank line ends the headers), 5 send nothing at all.
        if i < 50 {
            c.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
        }
        conns.push(c);
    }
    let live = tokio::task::spawn_blocking(move || http::get(port, "/health/live"))
        .await
        .unwrap();
    assert_eq!(live, Some((200, "ok\n".to_string())), "health answers");
    assert!(
        opened.elapsed() < header_timeout,
        "all opened within the timeout"
    );

    for (i, c) in conns.iter_mut().enumerate() {
        let closed = closed_within(c, header_timeout + Duration::from_secs(3)).await;
        assert!(
            closed.is_some(),
            "connection {i} still open after {:?}",
            opened.elapsed()
        );
    }
    let elapsed = opened.elapsed();
    // The timeout closed them: not before it ran out, and not much later.
    assert!(elapsed >= header_timeout, "closed after {elapsed:?}");
    assert!(
        elapsed < header_timeout + Duration::from_secs(3),
        "closed after {elapsed:?}"
    );
    let live = tokio::task::spawn_blocking(move || http::get(port, "/health/live"))
        .await
        .unwrap();
    assert_eq!(live.map(|r| r.0), Some(200));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused() {
    let (port, stop) = server(HttpConfig {
        max_connections: 5,
        header_timeout: Duration::from_secs(60),
        ..HttpConfig::default()
    })
    .await;
    // Five clients, each kept alive after an answered request: none is closed to make room.
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        c.write_all(b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut status = [0u8; 12];
        c.read_exact(&mut status).await.unwrap();
        assert_eq!(&status, b"HTTP/1.1 200");
        held.push(c);
    }
    let mut extra = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let answer = closed_within(&mut extra, Duration::from_secs(5))
        .await
        .expect("the sixth connection is closed at once");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // Health shares the limit (`http.probe_listen` has its own). (A client that sent its
    // request before the 503 may see a reset instead, as the server closes with it unread.)
    let refused = tokio::task::spawn_blocking(move || http::get(port, "/health/live"))
        .await
        .unwrap();
    assert!(refused.as_ref().is_none_or(|r| r.0 == 503), "{refused:?}");

    // One slot frees up: served again.
    drop(held.pop());
    let ok = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if http::get(port, "/health/live").is_some_and(|r| r.0 == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    });
    assert!(ok.await.unwrap(), "a freed slot serves again");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_needs_the_bearer_token_and_answers_within_the_request_timeout() {
    let mut h = Harness::new("http-token", 1);
    let mut config = h.config(
        "g-http",
        vec![counter(
            "flow",
            &["app_id"],
            "ht:{app_id}:{yyyyMMddHH}",
            Duration::from_secs(3600),
            "UTC",
            Duration::ZERO,
        )],
    );
    let port = tally_testkit::local_redis::free_port().unwrap();
    config.http.listen = format!("127.0.0.1:{port}");
    config.http.token = Some("t0ken-for-tests".into());
    config.http.request_timeout = Duration::from_secs(1);
    let at = chrono::Utc::now().timestamp_millis();
    for _ in 0..3 {
        h.produce(0, br#"{"app_id":"a1"}"#, Some(at));
    }
    h.flush_producer();
    let running = h.start(config);
    h.wait_applied("g-http", Duration::from_secs(60)).await;

    let path = format!("/v1/count?counter=flow&app_id=a1&at={at}");
    let ask = move |headers: &'static [(&'static str, &'static str)]| {
        let path = path.clone();
        tokio::task::spawn_blocking(move || http::request(port, &path, headers).expect("answer"))
    };
    let none = ask(&[]).await.unwrap();
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(
        none.header("www-authenticate")
            .is_some_and(|v| v.to_lowercase().starts_with("bearer")),
        "{:?}",
        none.headers
    );
    for wrong in [
        &[("Authorization", "Bearer t0ken-for-test")][..],
        &[("Authorization", "Bearer t0ken-for-testsX")],
        &[("Authorization", "Basic t0ken-for-tests")],
    ] {
        assert_eq!(ask(wrong).await.unwrap().status, 401, "{wrong:?}");
    }
    let right = ask(&[("Authorization", "Bearer t0ken-for-tests")])
        .await
        .unwrap();
    assert_eq!(right.status, 200, "{}", right.body);
    let json: serde_json::Value = serde_json::from_str(&right.body).unwrap();
    assert_eq!(json["value"], 3);
    // Scrapers and probes need no token.
    for open in ["/metrics", "/health/live", "/health/ready"] {
        let r = tokio::task::spawn_blocking(move || http::get(port, open))
            .await
            .unwrap();
        assert_eq!(r.map(|r| r.0), Some(200), "{open}");
    }

    // Redis stops answering for 3 s: the query is cut at the 1 s request timeout.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("ALL")
        .query(&mut h.conn())
        .unwrap();
    let asked = Instant::now();
    let stuck = ask(&[("Authorization", "Bearer t0ken-for-tests")])
        .await
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(stuck.status, 503, "{}", stuck.body);
    let problem: serde_json::Value = serde_json::from_str(&stuck.body).expect("problem+json");
    assert_eq!(problem["status"], 503, "{}", stuck.body);
    assert!(
        problem["type"].as_str().unwrap().ends_with("/timeout"),
        "{}",
        stuck.body
    );
    assert!(
        took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    wait_for("redis answers again", Duration::from_secs(10), || {
        redis::cmd("PING").query::<String>(&mut h.conn()).is_ok()
    })
    .await;
    running.stop().await;
}

/// A client that pipelines requests for large answers and never reads them fills its socket
/// buffers: the server's write blocks. It must not hold its connection (here the only one
/// allowed) past `request_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_its_answers_loses_its_connection() {
    let request_timeout = Duration::from_secs(1);
    let (port, stop) = server(HttpConfig {
        max_connections: 1,
        request_timeout,
        header_timeout: Duration::from_secs(60),
        ..HttpConfig::default()
    })
    .await;
    let body = tokio::task::spawn_blocking(move || http::get(port, "/metrics"))
        .await
        .unwrap()
        .expect("metrics answer")
        .1;
    // Enough answers to fill any loopback socket buffers (a few MiB each way) several times.
    let n = (64 << 20) / body.len().max(1) + 1;
    // One answered request first: the server has accepted this connection, so it holds the only
    // slot before anything below is timed. The metrics request's connection may still hold the
    // slot for a moment after it closed (answered 503): connect again until it is free.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stuck = loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        s.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        let answered = s.read_exact(&mut first).await.is_ok();
        if answered && &first == b"HTTP/1.1 200" {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the held connection never got the only slot: {:?}",
            String::from_utf8_lossy(&first)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let requests = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(n.min(20_000));
    // The server stops reading once its writes block: send what it takes, without waiting.
    let sending = tokio::spawn(async move {
        let _ = stuck.write_all(requests.as_bytes()).await;
        stuck
    });
    let started = Instant::now();
    let served = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http::get(port, "/health/live").is_some_and(|r| r.0 == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
    .await
    .unwrap();
    let waited = started.elapsed();
    assert!(
        served,
        "the connection slot is still held by a client that does not read, after {waited:?}"
    );
    assert!(waited >= request_timeout, "freed after {waited:?}");
    drop(sending);
    stop.cancel();
}

/// Every answer is counted by its route's template (never the path a caller sent), method and
/// status code; an unknown route is `unmatched`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_counted_by_route_template_method_and_code() {
    let h = Harness::new("http-answers", 1);
    let port = tally_testkit::local_redis::free_port().unwrap();
    let mut config = h.config("g-answers", crate::common::hourly("ans"));
    config.http.listen = format!("127.0.0.1:{port}");
    let running = h.start(config);
    wait_for("http answers", Duration::from_secs(30), || {
        http::get(port, "/health/live").is_some()
    })
    .await;
    let metrics = tokio::task::spawn_blocking(move || {
        for path in [
            "/health/live",
            "/no-such-route",
            "/v1/counters/flow?app_id=a-of-the-test&device_id=d1",
            "/v1/counters/flow?app_id=a-of-the-test&device_id=d1",
        ] {
            http::get(port, path).expect("an answer");
        }
        http::get(port, "/metrics").expect("metrics").1
    })
    .await
    .unwrap();
    let value = |route: &str, code: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("tally_http_answers_total{")
                    && l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("code=\"{code}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
    };
    assert_eq!(
        value("/health/live", "200").as_deref(),
        Some("2"),
        "{metrics}"
    );
    assert_eq!(value("unmatched", "404").as_deref(), Some("1"), "{metrics}");
    assert_eq!(
        value("/v1/counters/{name}", "200").as_deref(),
        Some("2"),
        "the template, not the path: {metrics}"
    );
    assert!(!metrics.contains("a-of-the-test"), "{metrics}");
    assert!(
        metrics
            .contains("tally_http_request_duration_seconds_count{route=\"/v1/counters/{name}\"} 2"),
        "{metrics}"
    );
    running.stop().await;
}
