//! A lean gRPC caller: h2's client with the gRPC frame written and read by hand. tonic's client
//! (`Channel`) hands each call to a buffer task, then to the connection's task, and boxes its
//! bodies per layer, on the same two cores as the server it measures. Two shapes: one connection
//! per caller driven by the caller's own task (what the hand-written HTTP/1.1 caller does), or
//! callers sharing a few connections, each driven by its own task (what Envoy does: one
//! connection per worker thread).

use std::future::Future;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use h2::client::{Connection, SendRequest};
use prost::Message as _;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_util::either::Either;

/// A connection's transport: plain TCP, or TLS over it.
type Io = Either<TcpStream, TlsStream<TcpStream>>;

/// One caller's HTTP/2 connection to the RLS port.
pub struct GrpcConn {
    send: SendRequest<Bytes>,
    /// The connection, when this caller drives it (not shared).
    conn: Option<Connection<Io, Bytes>>,
    frame: BytesMut,
}

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl GrpcConn {
    /// A connection of this caller's own.
    pub async fn connect(port: u16) -> anyhow::Result<GrpcConn> {
        let (send, conn) = handshake(port, None).await?;
        Ok(GrpcConn {
            send,
            conn: Some(conn),
            frame: BytesMut::with_capacity(256),
        })
    }

    /// A connection to share (clone it per caller), driven by a task of its own.
    pub async fn shared(port: u16) -> anyhow::Result<GrpcConn> {
        GrpcConn::shared_over(port, None).await
    }

    /// As [`GrpcConn::shared`], over TLS with `tls` when given (ALPN `h2`, server name
    /// `localhost`).
    pub async fn shared_over(port: u16, tls: Option<&TlsConnector>) -> anyhow::Result<GrpcConn> {
        let (send, conn) = handshake(port, tls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(GrpcConn {
            send,
            conn: None,
            frame: BytesMut::with_capacity(256),
        })
    }

    /// Another caller on a shared connection.
    pub fn caller(&self) -> GrpcConn {
        GrpcConn {
            send: self.send.clone(),
            conn: None,
            frame: BytesMut::with_capacity(256),
        }
    }

    /// One `ShouldRateLimit`: its response, or the gRPC status that ended it.
    pub async fn call(&mut self, req: &RateLimitRequest) -> anyhow::Result<RateLimitResponse> {
        self.frame.clear();
        self.frame.put_u8(0);
        self.frame.put_u32(req.encoded_len() as u32);
        req.encode(&mut self.frame)?;
        let frame = self.frame.split().freeze();
        let request = http::Request::post(format!("http://rls{PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let GrpcConn { send, conn, .. } = self;
        let exchange = async {
            let mut ready = send.clone().ready().await?;
            let (response, mut body) = ready.send_request(request, false)?;
            body.send_data(frame, true)?;
            let mut response = response.await?;
            let mut data = BytesMut::new();
            let body = response.body_mut();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
                data.extend_from_slice(&chunk);
            }
            let status = body
                .trailers()
                .await?
                .and_then(|t| t.get("grpc-status").cloned())
                .or_else(|| response.headers().get("grpc-status").cloned());
            anyhow::ensure!(
                status.as_ref().is_some_and(|s| s == "0"),
                "grpc-status {status:?}"
            );
            anyhow::ensure!(data.len() >= 5, "no message");
            let mut data = data.freeze();
            data.advance(5);
            Ok(RateLimitResponse::decode(data)?)
        };
        match conn {
            Some(conn) => with_connection(conn, exchange).await,
            None => exchange.await,
        }
    }
}

async fn handshake(
    port: u16,
    tls: Option<&TlsConnector>,
) -> anyhow::Result<(SendRequest<Bytes>, Connection<Io, Bytes>)> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let io = match tls {
        Some(tls) => {
            let name = rustls::pki_types::ServerName::try_from("localhost")?;
            Either::Right(tls.connect(name, stream).await?)
        }
        None => Either::Left(stream),
    };
    Ok(h2::client::handshake(io).await?)
}

/// A TLS client trusting the PEM CA file `ca` only, offering ALPN `h2`.
pub fn tls_connector(ca: &std::path::Path) -> anyhow::Result<TlsConnector> {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsConnector::from(std::sync::Arc::new(config)))
}

/// Run `exchange` while this task also drives the connection's I/O (h2's frames move only while
/// the connection is polled).
async fn with_connection<T>(
    conn: &mut Connection<Io, Bytes>,
    exchange: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        biased;
        result = exchange => result,
        closed = conn => {
            closed?;
            anyhow::bail!("connection closed")
        }
    }
}
