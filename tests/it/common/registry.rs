//! A schema registry stand-in on loopback: no registry server can be installed on these
//! machines (Confluent's and Apicurio's are Java), so this serves the calls of its documented
//! REST API tally makes, `GET /schemas/ids/{id}` → `{"schema": "<text>", "schemaType": …,
//! "references": […]}` and `GET /subjects/{subject}/versions/{version}` (a reference's schema;
//! 404 with error code 40403 for an unknown id), checks Basic credentials when given, and can
//! be taken down (503).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct Registry {
    pub url: String,
    /// Answers by request path.
    schemas: Arc<Mutex<HashMap<String, String>>>,
    /// Failing answers (status, body) by request path, before `schemas`.
    failing: Arc<Mutex<HashMap<String, (u16, String)>>>,
    /// Requests by path.
    asked: Arc<Mutex<HashMap<String, usize>>>,
    up: Arc<AtomicBool>,
    /// Requests answered 503 while down.
    pub refused: Arc<AtomicUsize>,
    /// Requests answered with a schema.
    pub served: Arc<AtomicUsize>,
    /// Connections closed before a request was read (a TLS handshake the client refused).
    pub failed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

/// What the serving thread shares with the [`Registry`] handle.
#[derive(Clone)]
struct State {
    schemas: Arc<Mutex<HashMap<String, String>>>,
    failing: Arc<Mutex<HashMap<String, (u16, String)>>>,
    asked: Arc<Mutex<HashMap<String, usize>>>,
    up: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    /// The `authorization: basic …` header line expected (lowercase), if any.
    expected: Option<String>,
}

impl Registry {
    /// `auth`: the expected `user:password`, if any.
    pub fn start(auth: Option<&str>) -> Registry {
        Registry::serve(auth, None)
    }

    /// As [`Registry::start`], over TLS with `pki`'s server certificate (for 127.0.0.1).
    pub fn start_tls(auth: Option<&str>, pki: &tally_testkit::certs::Pki) -> Registry {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server.cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&pki.server.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        Registry::serve(auth, Some(Arc::new(config)))
    }

    fn serve(auth: Option<&str>, tls: Option<Arc<rustls::ServerConfig>>) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let state = State {
            schemas: Arc::default(),
            failing: Arc::default(),
            asked: Arc::default(),
            up: Arc::new(AtomicBool::new(true)),
            refused: Arc::default(),
            served: Arc::default(),
            failed: Arc::default(),
            expected: auth
                .map(|a| format!("authorization: basic {}", base64(a.as_bytes())).to_lowercase()),
        };
        let r = Registry {
            url,
            schemas: state.schemas.clone(),
            failing: state.failing.clone(),
            asked: state.asked.clone(),
            up: state.up.clone(),
            refused: state.refused.clone(),
            served: state.served.clone(),
            failed: state.failed.clone(),
            stop: Arc::default(),
        };
        let stop = r.stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                match &tls {
                    None => state.answer(stream),
                    Some(config) => {
                        let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                        state.answer(rustls::StreamOwned::new(conn, stream));
                    }
                }
            }
        });
        r
    }

    /// An Avro schema as `id`.
    pub fn add(&self, id: u32, schema: &serde_json::Value) {
        let answer = serde_json::json!({ "schema": schema.to_string() });
        self.answer(format!("/schemas/ids/{id}"), answer);
    }

    /// A Protobuf schema (`.proto` text) as `id`, importing `references` (name, subject,
    /// version).
    pub fn add_protobuf(&self, id: u32, text: &str, references: &[(&str, &str, i64)]) {
        let references: Vec<_> = references
            .iter()
            .map(|(name, subject, version)| {
                serde_json::json!({"name": name, "subject": subject, "version": version})
            })
            .collect();
        let answer =
            serde_json::json!({"schemaType": "PROTOBUF", "schema": text, "references": references});
        self.answer(format!("/schemas/ids/{id}"), answer);
    }

    /// A Protobuf schema as `version` of `subject` (what a reference names).
    pub fn add_subject(&self, subject: &str, version: i64, text: &str) {
        let answer = serde_json::json!({"subject": subject, "version": version, "id": 1000 + version, "schemaType": "PROTOBUF", "schema": text});
        self.answer(format!("/subjects/{subject}/versions/{version}"), answer);
    }

    fn answer(&self, path: String, answer: serde_json::Value) {
        self.schemas
            .lock()
            .unwrap()
            .insert(path, answer.to_string());
    }

    /// Answers `GET /schemas/ids/{id}` with `status` and `body`, for ever: a registry that
    /// fails for this id only.
    pub fn fail(&self, id: u32, status: u16, body: String) {
        let path = format!("/schemas/ids/{id}");
        self.failing.lock().unwrap().insert(path, (status, body));
    }

    /// Requests made for `GET /schemas/ids/{id}`.
    pub fn asked(&self, id: u32) -> usize {
        let path = format!("/schemas/ids/{id}");
        self.asked.lock().unwrap().get(&path).copied().unwrap_or(0)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }
}

impl State {
    /// Read one request from `stream` and answer it (a handshake or read that fails: nothing).
    fn answer(&self, mut stream: impl Read + Write) {
        let mut head = Vec::new();
        {
            let mut reader = BufReader::new(&mut stream);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_string());
            }
        }
        if head.is_empty() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let path = head
            .first()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("")
            .to_string();
        *self.asked.lock().unwrap().entry(path.clone()).or_default() += 1;
        let failing = self.failing.lock().unwrap().get(&path).cloned();
        let authorized = self
            .expected
            .as_ref()
            .is_none_or(|e| head.iter().any(|h| h.to_lowercase() == *e));
        let (status, body) = if !self.up.load(Ordering::Relaxed) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            (
                "503 Service Unavailable",
                r#"{"error_code":50301,"message":"down"}"#.to_string(),
            )
        } else if !authorized {
            (
                "401 Unauthorized",
                r#"{"error_code":40101,"message":"unauthorized"}"#.to_string(),
            )
        } else if let Some((status, body)) = failing {
            let _ = write!(
                stream,
                "HTTP/1.1 {status} Failing\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(body.as_bytes());
            let _ = stream.flush();
            return;
        } else {
            match self.schemas.lock().unwrap().get(&path).cloned() {
                Some(answer) => {
                    self.served.fetch_add(1, Ordering::Relaxed);
                    ("200 OK", answer)
                }
                None => (
                    "404 Not Found",
                    r#"{"error_code":40403,"message":"Schema not found"}"#.to_string(),
                ),
            }
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.flush();
    }
}

impl Registry {
    /// tally's `[decode.schema_registry]` for this stand-in, with `user:password` if any.
    pub fn config(&self, auth: Option<(&str, &str)>) -> tally::config::RegistryConfig {
        tally::config::RegistryConfig {
            url: self.url.clone(),
            username: auth.map(|(u, _)| u.to_string()),
            password: auth.map(|(_, p)| p.to_string()),
            timeout: std::time::Duration::from_secs(2),
            ca_file: None,
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                char::from(ABC[(n >> (18 - 6 * i)) as usize & 63])
            } else {
                '='
            });
        }
    }
    out
}
