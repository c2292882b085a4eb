//! TLS on a port (rustls, ring): the certificate and key from files, optionally a CA that every
//! client certificate must chain to (mutual TLS), reloaded when the files change or on SIGHUP.
//! New connections get the configuration in force when they are accepted; open connections keep
//! theirs. A reload that does not load keeps the one in force (logged, counted).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::watch::WatchError;
use crate::config::TlsFiles;
use crate::ops::metrics::RequestMetrics;

/// How long after a read of the files that did not load they are read once more. A rotation
/// that rewrites the certificate and then the key in place (not a new file renamed over the old)
/// leaves them inconsistent for a moment: a key that is not the certificate's, a file half
/// written. Only a second failure counts as an error.
const SETTLE: Duration = Duration::from_secs(1);

/// A connection of a port: plain TCP, or TLS over it.
pub(crate) type PortStream = Either<TcpStream, TlsStream<TcpStream>>;

/// Why a port's TLS files do not load. The message names the setting and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key}: cannot read {file}: {source}")]
    Read {
        key: String,
        file: String,
        source: std::io::Error,
    },
    /// A file has nothing usable of what it should hold.
    #[error("{key}: {file}: {what}")]
    Content {
        key: String,
        file: String,
        what: String,
    },
    /// rustls refused the whole (a key that is not the certificate's, an unusable CA).
    #[error("{section}: {detail}")]
    Refused { section: String, detail: String },
}

/// The TLS of one port.
pub(crate) struct Tls {
    /// `http` or `rls`: the metrics' label and the settings' section (`<port>.tls`).
    port: &'static str,
    files: TlsFiles,
    /// ALPN protocols offered (`h2` for gRPC, `http/1.1` for HTTP).
    alpn: &'static [&'static [u8]],
    /// The configuration in force and the bytes of the files it was built from.
    current: RwLock<(Arc<ServerConfig>, Vec<u8>)>,
    metrics: RequestMetrics,
}

impl Tls {
    /// The port's TLS from `files`, or None when they are unset; an error when they do not load
    /// (before the port is bound).
    pub(crate) fn load(
        port: &'static str,
        files: &TlsFiles,
        alpn: &'static [&'static [u8]],
        metrics: &RequestMetrics,
    ) -> Result<Option<Arc<Tls>>, TlsError> {
        if !files.enabled() {
            return Ok(None);
        }
        let content = read_all(port, files)?;
        let config = build(port, files, &content, alpn)?;
        metrics.tls_reloads.with_label_values(&[port, "ok"]).inc();
        metrics.tls_reloads.with_label_values(&[port, "error"]);
        for reason in ["handshake", "timeout"] {
            metrics
                .tls_handshake_failures
                .with_label_values(&[port, reason]);
        }
        Ok(Some(Arc::new(Tls {
            port,
            files: files.clone(),
            alpn,
            current: RwLock::new((Arc::new(config), content)),
            metrics: metrics.clone(),
        })))
    }

    /// Read the files again and put them in force if they changed and load; `forced` (SIGHUP)
    /// reloads even when the bytes are the same (a CA file replaced by a symlink swap reads the
    /// same only by chance, but an operator asking gets a fresh load and a log line). Files that
    /// do not load are read once more after [`SETTLE`] before it counts as an error.
    fn reload(&self, forced: bool) {
        let error = match self.try_reload(forced) {
            Ok(()) => return,
            Err(e) => e,
        };
        tracing::debug!(port = self.port, error = %error, "tls files not loaded; reading them again");
        std::thread::sleep(SETTLE);
        if let Err(e) = self.try_reload(forced) {
            self.refused(&e);
        }
    }

    /// One read of the files, put in force when they changed (or `forced`) and load.
    fn try_reload(&self, forced: bool) -> Result<(), TlsError> {
        let content = read_all(self.port, &self.files)?;
        if !forced && self.current.read().1 == content {
            return Ok(());
        }
        let config = build(self.port, &self.files, &content, self.alpn)?;
        *self.current.write() = (Arc::new(config), content);
        self.metrics
            .tls_reloads
            .with_label_values(&[self.port, "ok"])
            .inc();
        tracing::info!(port = self.port, "tls certificate files loaded");
        Ok(())
    }

    fn refused(&self, e: &TlsError) {
        self.metrics
            .tls_reloads
            .with_label_values(&[self.port, "error"])
            .inc();
        tracing::error!(port = self.port, error = %e, "tls files not loaded; the certificate in force stays");
    }

    /// Reload when the files change (read every `reload_interval`) or on SIGHUP, until `stop`.
    pub(crate) async fn watch(self: Arc<Self>, stop: CancellationToken) -> Result<(), WatchError> {
        let what = self.port;
        let mut hup = super::watch::hangup(what)?;
        let mut tick = tokio::time::interval(self.files.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let forced = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tick.tick() => false,
                _ = hup.recv() => true,
            };
            let tls = self.clone();
            // File reads and key parsing off the async workers.
            tokio::task::spawn_blocking(move || tls.reload(forced))
                .await
                .map_err(|source| WatchError::Reload { what, source })?;
        }
    }

    /// The TLS handshake of `stream`, within `deadline`; None (counted) when it fails or takes
    /// longer: the caller drops the connection.
    async fn handshake(&self, stream: TcpStream, deadline: Duration) -> Option<PortStream> {
        let acceptor = TlsAcceptor::from(self.current.read().0.clone());
        let reason = match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => return Some(Either::Right(tls)),
            Ok(Err(e)) => {
                tracing::debug!(port = self.port, error = %e, "tls handshake failed");
                "handshake"
            }
            Err(_) => "timeout",
        };
        self.metrics
            .tls_handshake_failures
            .with_label_values(&[self.port, reason])
            .inc();
        None
    }
}

/// `stream` as the port speaks: through `tls`'s handshake (within `deadline`) when set, else as
/// it is.
pub(crate) async fn secure(
    tls: Option<&Tls>,
    stream: TcpStream,
    deadline: Duration,
) -> Option<PortStream> {
    match tls {
        Some(tls) => tls.handshake(stream, deadline).await,
        None => Some(Either::Left(stream)),
    }
}

/// The bytes of the certificate, key and client CA files, in that order (for change detection
/// and for parsing).
fn read_all(port: &str, files: &TlsFiles) -> Result<Vec<u8>, TlsError> {
    let mut out = Vec::new();
    for (name, path) in [
        ("cert_file", &files.cert_file),
        ("key_file", &files.key_file),
        ("client_ca_file", &files.client_ca_file),
    ] {
        if let Some(path) = path {
            let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
                key: format!("{port}.tls.{name}"),
                file: path.display().to_string(),
                source,
            })?;
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend(bytes);
        }
    }
    Ok(out)
}

/// The parts of `read_all`'s bytes, in order.
fn parts(content: &[u8]) -> Vec<&[u8]> {
    let mut rest = content;
    let mut out = Vec::new();
    while rest.len() >= 8 {
        let (len, tail) = rest.split_at(8);
        let n = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        let (part, tail) = tail.split_at(n.min(tail.len()));
        out.push(part);
        rest = tail;
    }
    out
}

fn build(
    port: &str,
    files: &TlsFiles,
    content: &[u8],
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let parts = parts(content);
    let file = |p: &Option<std::path::PathBuf>| {
        p.as_deref()
            .map_or(String::new(), |p: &Path| p.display().to_string())
    };
    let content_error =
        |name: &str, p: &Option<std::path::PathBuf>, what: String| TlsError::Content {
            key: format!("{port}.tls.{name}"),
            file: file(p),
            what,
        };
    let certs = certificates(parts[0])
        .map_err(|what| content_error("cert_file", &files.cert_file, what.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(parts[1]).map_err(|e| {
        content_error(
            "key_file",
            &files.key_file,
            format!("no usable PEM private key ({e})"),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let refused = |e: &dyn std::fmt::Display| TlsError::Refused {
        section: format!("{port}.tls"),
        detail: e.to_string(),
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(&e))?;
    let mut config = match parts.get(2) {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca).map_err(|what| {
                content_error("client_ca_file", &files.client_ca_file, what.to_string())
            })? {
                roots.add(cert).map_err(|e| {
                    content_error("client_ca_file", &files.client_ca_file, e.to_string())
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| refused(&e))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)
        }
        None => builder.with_no_client_auth().with_single_cert(certs, key),
    }
    .map_err(|e| refused(&e))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Why a file holds no certificate.
#[derive(Debug, thiserror::Error)]
enum NoCertificate {
    #[error("not PEM certificates ({0})")]
    NotPem(rustls::pki_types::pem::Error),
    #[error("no PEM certificate in it")]
    Empty,
}

/// The PEM certificates of a file (at least one).
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, NoCertificate> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(NoCertificate::NotPem)?;
    if certs.is_empty() {
        return Err(NoCertificate::Empty);
    }
    Ok(certs)
}
