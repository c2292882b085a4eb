//! What one client can hold of the HTTP port: a host re-opening half-sent TLS handshakes as fast
//! as they are closed does not keep others out (nor the health endpoints, on the port or on the
//! probe port); idle peers make room for a real client at once; and a full TLS port refuses
//! without writing plain text into a TLS client's handshake.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

use tally::config::{HttpConfig, TlsFiles};
use tally::ops::metrics::Metrics;
use tally_testkit::certs::Pki;
use tally_testkit::local_redis::free_port;

/// The first 8 bytes of a ClientHello (record header, handshake type, part of its length): a
/// handshake begun and never finished.
const HALF_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01];

/// The HTTP server alone (no Kafka, no Redis) on a free loopback port, with its metrics.
async fn server(config: HttpConfig) -> (u16, Metrics, CancellationToken) {
    server_with(config, None).await
}

/// [`server`] with `http.token` set to `token`.
async fn server_with(config: HttpConfig, token: Option<&str>) -> (u16, Metrics, CancellationToken) {
    let (stop, metrics) = (CancellationToken::new(), Metrics::new(&[]));
    let config = HttpConfig {
        listen: "127.0.0.1:0".into(),
        ..config
    };
    let tokens = tally::config::Tokens {
        token: token.map(str::to_string),
        admin: None,
    };
    let (addr, _) = tally::api::http::serve(
        &config,
        metrics.clone(),
        Arc::new(Default::default()),
        None,
        None,
        tokens,
        stop.clone(),
    )
    .await
    .expect("http server starts");
    (addr.port(), metrics, stop)
}

fn tls_files(name: &str) -> (Pki, TlsFiles) {
    let dir = std::env::temp_dir().join(format!("tally-bounds-{name}-{}", std::process::id()));
    let pki = Pki::create(&dir, name).unwrap();
    let files = TlsFiles {
        cert_file: Some(pki.server.cert.clone()),
        key_file: Some(pki.server.key.clone()),
        ..TlsFiles::default()
    };
    (pki, files)
}

/// A TCP connection to `port` from the loopback address `from` (127.0.0.x: another peer).
async fn connect_from(from: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
}

fn tls_client(pki: &Pki) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::CertificateDer::from_pem_file(&pki.ca).unwrap();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// `GET path` over TLS from `from`, `Connection: close`: the answer's status line, or the error.
async fn get_tls(
    tls: &tokio_rustls::TlsConnector,
    from: [u8; 4],
    port: u16,
    path: &str,
) -> std::io::Result<String> {
    let tcp = connect_from(from, port).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tls.connect(name, tcp).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    Ok(answer.lines().next().unwrap_or_default().to_string())
}

/// Keep `n` connections from 127.0.0.1 open, each having sent [`HALF_HELLO`], replacing each one
/// the server closes at once, until `stop`; the number of connections opened.
fn flood(port: u16, n: usize, stop: CancellationToken) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut opened = 0;
                    while !stop.is_cancelled() {
                        let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)).await else {
                            continue;
                        };
                        opened += 1;
                        let _ = c.write_all(HALF_HELLO).await;
                        let mut buf = [0u8; 64];
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = async { while !matches!(c.read(&mut buf).await, Ok(0) | Err(_)) {} } => {}
                        }
                    }
                    opened
                })
            })
            .collect();
        let mut opened = 0;
        for t in tasks {
            opened += t.await.unwrap();
        }
        opened
    })
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The review's reproduction: `max_connections = 8` on a TLS port, one host keeping 8 half-sent
/// ClientHellos open and re-opening each one closed. Every request of another host is answered,
/// and so is `/health/live`, on the port and on `http.probe_listen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_reopening_half_sent_handshakes_does_not_keep_others_out() {
    let (pki, tls) = tls_files("flood");
    let probe = free_port().unwrap();
    let (port, metrics, stop) = server(HttpConfig {
        max_connections: 8,
        probe_listen: format!("127.0.0.1:{probe}"),
        tls,
        ..HttpConfig::default()
    })
    .await;
    let connections = &metrics.request.connections;
    let open = connections.open.with_label_values(&["http"]);
    let flooding = CancellationToken::new();
    let flood = flood(port, 8, flooding.clone());
    wait_for(
        "the flood holds every slot",
        Duration::from_secs(10),
        || open.get() == 8,
    )
    .await;

    let client = tls_client(&pki);
    let mut answered = Vec::new();
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/health/live"
        } else {
            "/metrics"
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            get_tls(&client, [127, 0, 0, 2], port, path),
        )
        .await;
        answered.push(match answer {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => format!("error: {e}"),
            Err(_) => "no answer within 5 s".into(),
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let probed =
        tokio::task::spawn_blocking(move || tally_testkit::http::get(probe, "/health/live"))
            .await
            .unwrap();
    flooding.cancel();
    let opened = flood.await.unwrap();
    let ok = answered
        .iter()
        .filter(|s| s.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(ok, 20, "answered while flooded: {answered:?}");
    assert_eq!(probed, Some((200, "ok\n".to_string())), "the probe port");
    let evicted = connections.evicted.with_label_values(&["http"]).get();
    assert!(
        evicted >= 20,
        "a slot made for each request: {evicted} evicted"
    );
    assert!(opened > 8, "the flood re-opened what was closed: {opened}");
    stop.cancel();
}

/// Peers that connect and send nothing hold every slot: a new client is served at once (not at
/// `header_timeout`, here a minute), in place of the oldest of them, which is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_peers_make_room_for_a_client_at_once() {
    let (port, metrics, stop) = server(HttpConfig {
        max_connections: 4,
        header_timeout: Duration::from_secs(60),
        ..HttpConfig::default()
    })
    .await;
    let mut idle = Vec::new();
    for host in 1..=4 {
        idle.push(connect_from([127, 0, 0, host], port).await.unwrap());
    }
    let open = metrics
        .request
        .connections
        .open
        .with_label_values(&["http"]);
    wait_for(
        "the idle peers hold every slot",
        Duration::from_secs(5),
        || open.get() == 4,
    )
    .await;
    let started = Instant::now();
    let live = tokio::task::spawn_blocking(move || tally_testkit::http::get(port, "/health/live"))
        .await
        .unwrap();
    assert_eq!(live, Some((200, "ok\n".to_string())));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut buf = [0u8; 16];
    let oldest = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf)).await;
    assert!(
        matches!(oldest, Ok(Ok(0)) | Ok(Err(_))),
        "the oldest idle peer was closed: {oldest:?}"
    );
    let evicted = metrics
        .request
        .connections
        .evicted
        .with_label_values(&["http"]);
    assert_eq!(evicted.get(), 1);
    stop.cancel();
}

/// A TLS port whose every slot serves a client refuses one more without writing a byte: a TLS
/// client sees the connection closed, not a plain-text 503 it would read as a broken record
/// (`WRONG_VERSION_NUMBER`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tls_port_refuses_without_writing_plain_text() {
    let (pki, tls) = tls_files("refusal");
    let (port, metrics, stop) = server(HttpConfig {
        max_connections: 1,
        header_timeout: Duration::from_secs(60),
        tls,
        ..HttpConfig::default()
    })
    .await;
    // One client holds the only slot, kept alive after a request (so it is never evicted).
    let client = tls_client(&pki);
    let tcp = connect_from([127, 0, 0, 1], port).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut held = client.connect(name, tcp).await.unwrap();
    held.write_all(b"GET /health/live HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    held.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");

    let mut raw = connect_from([127, 0, 0, 2], port).await.unwrap();
    raw.write_all(HALF_HELLO).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 256];
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the refused connection was closed");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "",
        "nothing written in clear"
    );

    let refused = get_tls(&client, [127, 0, 0, 3], port, "/health/live").await;
    let e = refused.expect_err("no room");
    assert_ne!(
        e.kind(),
        std::io::ErrorKind::InvalidData,
        "not a broken record: {e}"
    );
    let full = metrics
        .request
        .connections
        .refused
        .with_label_values(&["http", "full"]);
    assert_eq!(full.get(), 2);
    stop.cancel();
}

/// With `http.max_connections_per_peer = 2`, a host whose two connections serve requests is
/// refused a third (503) while another host is served: its share, not the port, is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_holds_at_most_its_share_of_the_http_port() {
    let (port, metrics, stop) = server(HttpConfig {
        max_connections: 8,
        max_connections_per_peer: Some(2),
        header_timeout: Duration::from_secs(60),
        ..HttpConfig::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = connect_from([127, 0, 0, 1], port).await.unwrap();
        assert_eq!(ask(&mut c, "/health/live", None).await, 200);
        held.push(c);
    }
    let mut third = connect_from([127, 0, 0, 1], port).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let mut other = connect_from([127, 0, 0, 2], port).await.unwrap();
    other
        .write_all(b"GET /health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    other.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "another host is served"
    );
    let refused = metrics
        .request
        .connections
        .refused
        .with_label_values(&["http", "peer"]);
    assert_eq!(refused.get(), 1);
    stop.cancel();
}

/// `GET path` on keep-alive connection `c` (with `token` as the bearer token): the status code,
/// the whole answer read (its `content-length`), so the next request reads its own.
async fn ask(c: &mut TcpStream, path: &str, token: Option<&str>) -> u16 {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\n");
    c.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        c.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
    let mut body = vec![0u8; length];
    c.read_exact(&mut body).await.unwrap();
    head[9..12].parse().unwrap()
}

/// With `http.token` set, only a request with the token admits a connection for good: hosts that
/// keep connections open after requests to the open endpoints (health, metrics) make room for a
/// client with the token, which is then never closed for a newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_endpoints_alone_do_not_keep_a_slot_from_a_client_with_the_token() {
    let (port, metrics, stop) = server_with(
        HttpConfig {
            max_connections: 3,
            header_timeout: Duration::from_secs(60),
            ..HttpConfig::default()
        },
        Some("t0ken"),
    )
    .await;
    let mut open = Vec::new();
    for host in 1..=3 {
        let mut c = connect_from([127, 0, 0, host], port).await.unwrap();
        assert_eq!(ask(&mut c, "/health/live", None).await, 200);
        open.push(c);
    }
    let mut client = connect_from([127, 0, 0, 4], port).await.unwrap();
    assert_ne!(ask(&mut client, "/v1/status", Some("t0ken")).await, 401);
    let mut buf = [0u8; 64];
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if matches!(open[0].read(&mut buf).await, Ok(0) | Err(_)) {
                return;
            }
        }
    })
    .await;
    assert!(first.is_ok(), "the oldest health-only connection made room");
    // Two more newcomers close the other two, never the client with the token.
    for host in 5..=6 {
        let mut c = connect_from([127, 0, 0, host], port).await.unwrap();
        assert_eq!(ask(&mut c, "/health/live", None).await, 200);
        open.push(c);
    }
    assert_ne!(ask(&mut client, "/v1/status", Some("t0ken")).await, 401);
    let evicted = metrics
        .request
        .connections
        .evicted
        .with_label_values(&["http"]);
    assert_eq!(evicted.get(), 3);
    stop.cancel();
}
