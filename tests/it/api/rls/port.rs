//! The RLS port itself: the bearer token on `ShouldRateLimit` (the health service stays open),
//! and routing by service (an unknown one is `UNIMPLEMENTED`, the others keep answering).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus::Serving;

use crate::common::rls::{descriptor, health_watch, unique, RlsServer, API};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_http_token_set_should_rate_limit_needs_it() {
    let server = RlsServer::start_with("token", &[("api.yaml", API)], Some("s3cret-rls"), "");
    let rls = &server.rls;
    let mut c = rls.client().await;
    let user = unique("tok");
    let call = |auth: Option<&str>| {
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &user)], None)],
            hits_addend: 0,
        });
        if let Some(a) = auth {
            req.metadata_mut()
                .insert("authorization", a.parse().unwrap());
        }
        req
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret-rls"),
        Some("Basic s3cret-rls"),
    ] {
        let e = c.should_rate_limit(call(auth)).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{auth:?}: {e:?}");
    }
    let r = c
        .should_rate_limit(call(Some("Bearer s3cret-rls")))
        .await
        .expect("the token passes")
        .into_inner();
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "refused calls charged nothing"
    );
    // The health service stays open, as /health/* does.
    health_watch(rls.port).await.wait_for(Serving).await;
}

/// The port routes by service: a call to a service it does not serve is answered
/// `UNIMPLEMENTED` (as gRPC says), and the connection keeps serving the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_grpc_service_is_unimplemented() {
    let server = RlsServer::start("unknown-service", &[("api.yaml", API)]);
    let rls = &server.rls;
    let mut c = rls.client().await;
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", rls.port))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = "/no.such.Service/Call".parse().unwrap();
    let e = grpc
        .unary(tonic::Request::new(()), path, Empty)
        .await
        .expect_err("no such service");
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    let user = unique("unknown-service");
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &user)], None)],
            hits_addend: 0,
        })
        .await
        .expect("the rate limit service still answers")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
}

/// A codec of empty messages (an unknown service has no generated stubs).
#[derive(Clone, Copy)]
struct Empty;

impl tonic::codec::Codec for Empty {
    type Encode = ();
    type Decode = ();
    type Encoder = Empty;
    type Decoder = Empty;

    fn encoder(&mut self) -> Empty {
        Empty
    }

    fn decoder(&mut self) -> Empty {
        Empty
    }
}

impl tonic::codec::Encoder for Empty {
    type Item = ();
    type Error = tonic::Status;

    fn encode(&mut self, _: (), _: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        Ok(())
    }
}

impl tonic::codec::Decoder for Empty {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, _: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        Ok(Some(()))
    }
}

/// The port's limits: a peer that never answers the keep-alive PING loses its connection (its
/// slot is then free), while a live client, which answers, keeps its own; with
/// `rls.max_connections = 2` held by clients that made calls, a third connection is closed as it
/// is accepted (no HTTP/2 settings sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_capped_and_silent_peers_are_dropped() {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let server = RlsServer::start_with(
        "limits",
        &[("api.yaml", API)],
        None,
        "max_connections = 2\nkeepalive_interval = \"1s\"\nkeepalive_timeout = \"1s\"",
    );
    let rls = &server.rls;
    let call = |c: &mut crate::common::rls::Client| {
        let mut c = c.clone();
        let user = unique("limits");
        async move {
            c.should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("user", &user)], None)],
                hits_addend: 0,
            })
            .await
            .map(|r| r.into_inner().overall_code == Code::Ok as i32)
        }
    };
    let mut live = rls.client().await;
    assert!(call(&mut live).await.unwrap(), "the first client is served");

    // A peer that opens HTTP/2 and then never reads or answers.
    let connect = || async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rls.port))
            .await
            .unwrap();
        // The client preface and an empty SETTINGS frame.
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        s
    };
    // Bytes the server sends until it closes (or `within` passes: None).
    async fn until_closed(s: &mut tokio::net::TcpStream, within: Duration) -> Option<usize> {
        let mut got = 0;
        let mut buf = [0u8; 1024];
        tokio::time::timeout(within, async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got += n,
                }
            }
        })
        .await
        .ok()
    }
    let mut silent = connect().await;
    let mut first = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), silent.read_exact(&mut first))
        .await
        .expect("the server's SETTINGS")
        .unwrap();
    assert_eq!(
        first[3], 4,
        "a SETTINGS frame first: the silent peer holds a slot"
    );
    let held = Instant::now();

    let sent = until_closed(&mut silent, Duration::from_secs(15))
        .await
        .expect("the silent peer is dropped after its unanswered PING");
    assert!(sent > 0, "it was PINGed before being dropped");
    assert!(
        held.elapsed() >= Duration::from_millis(900),
        "dropped for its silence ({:?}), not at once",
        held.elapsed()
    );
    // The live client answered its PINGs: still served, and the freed slot takes a new one.
    assert!(
        call(&mut live).await.unwrap(),
        "the live client kept its connection"
    );
    let mut again = rls.client().await;
    assert!(
        call(&mut again).await.unwrap(),
        "the freed slot serves a new client"
    );
    // Both slots serve clients that made calls: none is closed to make room, one more is closed
    // as it is accepted.
    let mut third = connect().await;
    assert_eq!(
        until_closed(&mut third, Duration::from_secs(5)).await,
        Some(0),
        "over rls.max_connections: closed at once, nothing served"
    );
    assert!(call(&mut live).await.unwrap() && call(&mut again).await.unwrap());
}

/// Peers that connect and send nothing (not even the HTTP/2 preface: hyper has no deadline for
/// it), or only calls without the token, hold no slot past `rls.first_call_timeout`: with every
/// one of `max_connections` taken by such peers, a real client is served as soon as they are
/// closed. And one address holds at most `max_connections_per_peer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_unauthenticated_peers_cannot_hold_the_slots() {
    use std::time::{Duration, Instant};
    use tokio::io::AsyncReadExt as _;

    let server = RlsServer::start_with(
        "idle",
        &[("api.yaml", API)],
        Some("rls-t0ken"),
        "max_connections = 4\nfirst_call_timeout = \"500ms\"",
    );
    let rls = &server.rls;
    let user = unique("idle");
    let call = |mut c: crate::common::rls::Client, token: Option<&'static str>| {
        let user = user.clone();
        async move {
            let mut request = tonic::Request::new(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("user", &user)], None)],
                hits_addend: 0,
            });
            if let Some(t) = token {
                request
                    .metadata_mut()
                    .insert("authorization", format!("Bearer {t}").parse().unwrap());
            }
            c.should_rate_limit(request).await
        }
    };
    // One peer that calls without the token and three silent ones take all four slots.
    let unauthenticated = rls.client().await;
    let refused = call(unauthenticated.clone(), None).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(
            tokio::net::TcpStream::connect(("127.0.0.1", rls.port))
                .await
                .unwrap(),
        );
    }
    let taken = Instant::now();

    // A real client is served within a few seconds: the others are closed at 500 ms.
    let mut served = None;
    while taken.elapsed() < Duration::from_secs(5) {
        let attempt = async {
            let url = format!("http://127.0.0.1:{}", rls.port);
            let c = crate::common::rls::Client::connect(url).await.ok()?;
            call(c, Some("rls-t0ken")).await.ok()
        };
        if let Ok(Some(r)) = tokio::time::timeout(Duration::from_secs(1), attempt).await {
            served = Some(r.into_inner());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = served.unwrap_or_else(|| {
        panic!(
            "no client served within 5 s while idle peers held the slots:\n{}",
            rls.tally.log()
        )
    });
    assert_eq!(served.overall_code, Code::Ok as i32);
    // The silent peers were closed by the server, not left open.
    for mut s in silent {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert_eq!(closed, Ok(true), "a silent peer was closed");
    }
}

/// One peer address holds at most `rls.max_connections_per_peer`; with all of them serving
/// calls, more from it are closed as they are accepted while the slots stay free for other hosts
/// (here: once it lets go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share() {
    use std::time::Duration;
    use tokio::io::AsyncReadExt as _;

    let server = RlsServer::start_with(
        "per-peer",
        &[("api.yaml", API)],
        None,
        "max_connections_per_peer = 2",
    );
    let rls = &server.rls;
    // Two clients that made calls (a connection without one would be closed to make room).
    let (mut first, mut second) = (rls.client().await, rls.client().await);
    for c in [&mut first, &mut second] {
        c.should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &unique("per-peer"))], None)],
            hits_addend: 0,
        })
        .await
        .unwrap();
    }
    let mut third = tokio::net::TcpStream::connect(("127.0.0.1", rls.port))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a third connection from one address is closed at once: {read:?}"
    );
    drop((first, second));
    // Its places come back as its connections close.
    let again = tokio::time::timeout(Duration::from_secs(10), rls.client()).await;
    assert!(again.is_ok(), "served again once it let go");
}

/// Silent peers holding every slot (8, two from each of four addresses, each at its
/// `max_connections_per_peer`) make room for a client from a fifth address at once, long before
/// `rls.first_call_timeout` (here a minute) would close them: the oldest is closed, and the
/// client's calls are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_make_room_for_a_client_at_once() {
    use std::time::{Duration, Instant};
    use tokio::io::AsyncReadExt as _;

    let server = RlsServer::start_with(
        "room",
        &[("api.yaml", API)],
        None,
        "max_connections = 8\nmax_connections_per_peer = 2\nfirst_call_timeout = \"60s\"",
    );
    let rls = &server.rls;
    // The port is up once a client connects; it leaves again (its slot is given back).
    drop(rls.client().await);
    let metric = "tally_port_connections{port=\"rls\"}";
    assert!(
        tally_testkit::wait::wait_until(Duration::from_secs(10), || rls.tally.metric(metric)
            == Some(0.0)),
        "the first client's connection closed"
    );
    // Two silent connections from each of four addresses (the per-peer cap): every slot.
    let mut silent = Vec::new();
    for host in 2..=5 {
        for _ in 0..2 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(([127, 0, 0, host], 0).into()).unwrap();
            let s = socket
                .connect(([127, 0, 0, 1], rls.port).into())
                .await
                .unwrap();
            silent.push(s);
        }
    }
    assert!(
        rls.tally.wait_metric(metric, 8.0, Duration::from_secs(10)),
        "the silent peers hold every slot: {:?}",
        rls.tally.metric(metric)
    );
    let started = Instant::now();
    let mut client = tokio::time::timeout(Duration::from_secs(5), rls.client())
        .await
        .expect("a client served while silent peers held the port");
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &unique("room"))], None)],
            hits_addend: 0,
        })
        .await
        .unwrap();
    assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match silent[0].read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the oldest silent peer was closed");
    assert!(
        rls.tally
            .metric("tally_port_connections_evicted_total{port=\"rls\"}")
            >= Some(1.0)
    );
}
