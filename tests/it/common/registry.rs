//! A schema registry stand-in on loopback: no registry server can be installed on these
//! machines (Confluent's and Apicurio's are Java), so this serves the calls of its documented
//! REST API tally makes, `GET /schemas/ids/{id}` → `{"schema": "<text>", "schemaType": …,
//! "references": […]}` and `GET /subjects/{subject}/versions/{version}` (a reference's schema;
//! 404 with error code 40403 for an unknown id), checks Basic credentials when given, and can
//! be taken down (503).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct Registry {
    pub url: String,
    /// Answers by request path.
    schemas: Arc<Mutex<HashMap<String, String>>>,
    up: Arc<AtomicBool>,
    /// Requests answered 503 while down.
    pub refused: Arc<AtomicUsize>,
    /// Requests answered with a schema.
    pub served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Registry {
    /// `auth`: the expected `user:password`, if any.
    pub fn start(auth: Option<&str>) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let r = Registry {
            url,
            schemas: Arc::default(),
            up: Arc::new(AtomicBool::new(true)),
            refused: Arc::default(),
            served: Arc::default(),
            stop: Arc::default(),
        };
        let (schemas, up, refused, served, stop) = (
            r.schemas.clone(),
            r.up.clone(),
            r.refused.clone(),
            r.served.clone(),
            r.stop.clone(),
        );
        let expected =
            auth.map(|a| format!("authorization: basic {}", base64(a.as_bytes())).to_lowercase());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push(line.trim_end().to_string());
                }
                let path = head
                    .first()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or("")
                    .to_string();
                let authorized = expected
                    .as_ref()
                    .is_none_or(|e| head.iter().any(|h| h.to_lowercase() == *e));
                let (status, body) = if !up.load(Ordering::Relaxed) {
                    refused.fetch_add(1, Ordering::Relaxed);
                    (
                        "503 Service Unavailable",
                        r#"{"error_code":50301,"message":"down"}"#.to_string(),
                    )
                } else if !authorized {
                    (
                        "401 Unauthorized",
                        r#"{"error_code":40101,"message":"unauthorized"}"#.to_string(),
                    )
                } else {
                    match schemas.lock().unwrap().get(&path).cloned() {
                        Some(answer) => {
                            served.fetch_add(1, Ordering::Relaxed);
                            ("200 OK", answer)
                        }
                        None => (
                            "404 Not Found",
                            r#"{"error_code":40403,"message":"Schema not found"}"#.to_string(),
                        ),
                    }
                };
                let mut stream = reader.into_inner();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
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

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
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
        }
    }
}

/// Runs the Python event writer `script` (under `tests/it/`) on the JSON `lines`; its output
/// is each payload as a 4-byte big-endian length and the bytes, returned in order.
pub fn python_writer(script: &str, lines: String) -> Vec<Vec<u8>> {
    let path = format!("{}/tests/it/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new("python3")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/setup.sh installs fastavro and protobuf)");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(lines.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{script} failed");
    let (mut payloads, mut rest) = (Vec::new(), &out.stdout[..]);
    while rest.len() >= 4 {
        let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        payloads.push(rest[4..4 + n].to_vec());
        rest = &rest[4 + n..];
    }
    payloads
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
