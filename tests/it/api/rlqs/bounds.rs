//! What one quota-service client can hold, through the generated gRPC stubs (the protocol
//! Envoy's filter speaks), on `tally serve` and a real redis-server: streams that send no
//! report are closed after `rlqs.assignment_ttl`, one connection and one peer hold a bounded
//! share of the streams, and a report counts no more than its stream was granted plus
//! `rlqs.report_slack`.

use std::net::IpAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tally_testkit::local_redis::LocalRedis;
use tonic::codegen::{http, Service};
use tonic::transport::{Channel, Endpoint};

use crate::api::rlqs::service::{bucket, granted, usage, Stream};
use crate::common::rls::{limits_dir, Rls};

/// `[rlqs]` with a 2 s TTL (so a silent stream is closed after 2 s), `extra` appended, and one
/// limit: `limit` requests per minute per tenant.
fn start(redis: &LocalRedis, name: &str, limit: u64, extra: &str) -> Rls {
    let dir = limits_dir(name);
    std::fs::write(dir.join("edge.yaml"), "domain: other\ndescriptors: []\n").unwrap();
    let rlqs = format!(
        "\n[rlqs]\nreport_interval = \"1s\"\nassignment_ttl = \"2s\"\nabandon_after = \"60s\"\n{extra}\n\
         [[rlqs.buckets]]\ndomain = \"edge\"\nname = \"per_tenant\"\nlimit = {limit}\nwindow = \"1m\"\n\
         match = {{ name = \"per_tenant\" }}\n"
    );
    Rls::start_with(redis, &dir, name, None, &rlqs)
}

fn metrics(rls: &Rls) -> String {
    tally_testkit::http::request(rls.tally.port, "/metrics", &[])
        .unwrap()
        .body
}

/// Connects from a chosen loopback address, as another host would.
#[derive(Clone)]
struct From(IpAddr);

impl Service<http::Uri> for From {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let local = self.0;
        Box::pin(async move {
            let port = uri.port_u16().unwrap_or(80);
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind((local, 0).into())?;
            let stream = socket.connect(([127, 0, 0, 1], port).into()).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

async fn channel_from(port: u16, local: &str) -> Channel {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_with_connector(From(local.parse().unwrap()))
        .await
        .unwrap()
}

async fn channel(port: u16) -> Channel {
    channel_from(port, "127.0.0.1").await
}

/// One client opens every stream of the replica and sends nothing: another Envoy is answered
/// within the TTL, once the silent streams are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_streams_are_closed_and_another_envoy_is_answered() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(&redis, "rlqs-silent", 1000, "max_streams = 8");
    let _ = rls.client().await;
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(Stream::open(rls.port, None).await.expect("a free slot"));
    }
    let refused = Stream::open(rls.port, None).await.err().map(|s| s.code());
    assert_eq!(refused, Some(tonic::Code::ResourceExhausted), "all 8 held");

    // Another Envoy retries as Envoy does; it must be answered soon after the TTL (2 s).
    let id = bucket(&[("name", "per_tenant"), ("tenant", "honest")]);
    let answered = loop {
        if let Ok(mut s) = Stream::open(rls.port, None).await {
            let answer = s.report("edge", vec![usage(&id, 1, 0)]).await.unwrap();
            break granted(&answer);
        }
        assert!(
            opened.elapsed() < Duration::from_secs(8),
            "still refused 8 s after the silent streams opened; log: {}",
            rls.tally.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(answered.is_some_and(|g| g > 0), "a grant: {answered:?}");

    // Each silent stream was ended by the server, saying why.
    for mut s in silent {
        let end = tokio::time::timeout(Duration::from_secs(5), s.rx.message())
            .await
            .expect("ended by the server");
        assert_eq!(
            end.err().map(|e| e.code()),
            Some(tonic::Code::DeadlineExceeded)
        );
    }
    assert!(
        metrics(&rls).contains("tally_rlqs_skipped_total{reason=\"report_timeout\"} 8"),
        "{}",
        metrics(&rls)
    );
}

/// One connection and one peer hold a bounded share; another host still gets a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_and_one_peer_hold_a_bounded_share() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(
        &redis,
        "rlqs-peers",
        1000,
        "max_streams = 8\nmax_streams_per_peer = 4\nmax_streams_per_connection = 2",
    );
    let _ = rls.client().await;
    let refusal = |r: Result<Stream, tonic::Status>| {
        let e = r.err().expect("refused");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        e.message().to_string()
    };
    let a = channel(rls.port).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(Stream::on(a.clone(), None).await.unwrap());
    }
    let third = refusal(Stream::on(a.clone(), None).await);
    assert!(third.contains("max_streams_per_connection"), "{third}");

    let b = channel(rls.port).await;
    for _ in 0..2 {
        held.push(Stream::on(b.clone(), None).await.unwrap());
    }
    let fifth = refusal(Stream::on(channel(rls.port).await, None).await);
    assert!(fifth.contains("max_streams_per_peer"), "{fifth}");

    // Another address has slots of its own, and is answered.
    let other = channel_from(rls.port, "127.0.0.2").await;
    let mut s = Stream::on(other, None)
        .await
        .expect("another peer's stream");
    let id = bucket(&[("name", "per_tenant"), ("tenant", "t")]);
    let answer = s.report("edge", vec![usage(&id, 1, 0)]).await.unwrap();
    assert!(granted(&answer).is_some_and(|g| g > 0));

    // A closed stream gives its slot back.
    drop(held.pop());
    // The slot is given back when the server sees the stream end: a try before that is
    // refused again (by the connection's cap, checked first), and counted.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut early = 0;
    while Stream::on(b.clone(), None).await.is_err() {
        early += 1;
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = metrics(&rls);
    for (reason, refused) in [
        ("too_many_streams_per_connection", 1 + early),
        ("too_many_streams_per_peer", 1),
    ] {
        let line = format!("tally_rlqs_skipped_total{{reason=\"{reason}\"}} {refused}");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
}

/// A report of 10^15 allowed requests for tenant `victim` counts only what its stream was
/// granted plus the slack: a new honest Envoy for `victim` still gets a token bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_beyond_its_grants_counts_only_its_grants() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(&redis, "rlqs-forged", 1000, "");
    let _ = rls.client().await;
    let victim = bucket(&[("name", "per_tenant"), ("tenant", "victim")]);
    let mut forger = Stream::open(rls.port, None).await.unwrap();
    let first = granted(
        &forger
            .report("edge", vec![usage(&victim, 1, 0)])
            .await
            .unwrap(),
    )
    .expect("a grant");
    assert!(first > 0);
    let forged = 1_000_000_000_000_000;
    forger
        .report("edge", vec![usage(&victim, forged, 0)])
        .await
        .unwrap();

    let mut honest = Stream::open(rls.port, None).await.unwrap();
    let answer = honest
        .report("edge", vec![usage(&victim, 0, 1)])
        .await
        .unwrap();
    let grant = granted(&answer);
    assert!(
        grant.is_some_and(|g| g > 0),
        "a new Envoy for victim: {answer:?}"
    );

    // The excess is counted and logged with the client.
    let text = metrics(&rls);
    let excess = text
        .lines()
        .find(|l| {
            l.starts_with("tally_rlqs_excess_requests_total{domain=\"edge\",limit=\"per_tenant\"}")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no excess series in\n{text}"));
    assert!(excess >= (forged - 1000) as f64, "excess {excess}");
    let log = rls.tally.log();
    let line = log
        .lines()
        .find(|l| l.contains("rlqs report beyond its grants"))
        .unwrap_or_else(|| panic!("no WARN line in\n{log}"));
    assert!(
        line.contains("peer=127.0.0.1") && line.contains("excess="),
        "{line}"
    );
}
