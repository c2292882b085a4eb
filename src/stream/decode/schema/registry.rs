//! A schema registry's REST API, the one call tally needs: `GET /schemas/ids/{id}`
//! (`{"schema": "<the schema's text>", "schemaType": …, "references": […]}`; no `schemaType`
//! is Avro). The format reading the events decides whether the type is one it reads.

use serde::Deserialize;

use crate::config::RegistrySettings;

/// What the registry said about an id.
pub(in crate::stream::decode) enum Fetch {
    /// The schema.
    Found(Schema),
    /// 404.
    NotFound,
    /// An answer about this id that is not its schema: a 5xx, or a 200 over 1 MiB or not a
    /// schema. The registry may be failing (then it fails for every id) or only this id may be.
    Failed(String),
    /// No answer, or one that is not about this id (401, 403, 429, a timeout, a refused
    /// connection): an outage.
    Unavailable(String),
}

pub(in crate::stream::decode) struct Registry {
    agent: ureq::Agent,
    base: String,
    /// `Basic …`, built once (never logged).
    authorization: Option<String>,
}

/// The registry's answer for an id.
#[derive(Deserialize)]
pub(in crate::stream::decode) struct Schema {
    /// The schema's text (Avro JSON, `.proto` source).
    pub(in crate::stream::decode) schema: String,
    /// `AVRO` (also when absent), `PROTOBUF` or `JSON`.
    #[serde(rename = "schemaType", default)]
    pub(in crate::stream::decode) schema_type: Option<String>,
    /// Other subjects' schemas this one imports (a Protobuf `import`).
    #[serde(default)]
    pub(in crate::stream::decode) references: Vec<Reference>,
}

/// A schema's reference to another: the name it is imported by, and where it is registered.
#[derive(Deserialize, Clone)]
pub(in crate::stream::decode) struct Reference {
    /// The import's file name (Protobuf) or type name (Avro).
    pub(in crate::stream::decode) name: String,
    /// The subject and version that hold the referenced schema.
    pub(in crate::stream::decode) subject: String,
    /// Its version in that subject.
    pub(in crate::stream::decode) version: i64,
}

impl Schema {
    /// Whether the registry says this is a schema of `kind` (`AVRO` when it says nothing).
    pub(in crate::stream::decode) fn is(&self, kind: &str) -> bool {
        self.schema_type.as_deref().unwrap_or("AVRO") == kind
    }
}

impl Registry {
    /// A client of the registry `settings` describe (their CA certificates read already).
    pub(in crate::stream::decode) fn new(settings: &RegistrySettings) -> Registry {
        let config = &settings.config;
        let mut agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout));
        if !settings.ca.is_empty() {
            let roots = ureq::tls::RootCerts::new_with_certs(&settings.ca);
            let tls = ureq::tls::TlsConfig::builder().root_certs(roots).build();
            agent = agent.tls_config(tls);
        }
        let agent = agent.build().into();
        let authorization = config.username.as_ref().map(|user| {
            let pair = format!("{user}:{}", config.password.as_deref().unwrap_or(""));
            format!("Basic {}", base64(pair.as_bytes()))
        });
        Registry {
            agent,
            base: config.url.trim_end_matches('/').to_string(),
            authorization,
        }
    }

    /// The schema of `id`.
    pub(in crate::stream::decode) fn schema(&self, id: u32) -> Fetch {
        self.get(&format!("/schemas/ids/{id}"))
    }

    /// The schema a reference names: `version` of `subject`.
    pub(in crate::stream::decode) fn reference(&self, r: &Reference) -> Fetch {
        let subject: String = r
            .subject
            .bytes()
            .map(
                |b| match b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    true => char::from(b).to_string(),
                    false => format!("%{b:02X}"),
                },
            )
            .collect();
        self.get(&format!("/subjects/{subject}/versions/{}", r.version))
    }

    fn get(&self, path: &str) -> Fetch {
        let mut request = self.agent.get(&format!("{}{path}", self.base));
        if let Some(a) = &self.authorization {
            request = request.header("Authorization", a);
        }
        match request.call() {
            Ok(mut r) if r.status() == 200 => {
                match r
                    .body_mut()
                    .with_config()
                    .limit(1 << 20)
                    .read_json::<Schema>()
                {
                    Ok(a) => Fetch::Found(a),
                    Err(e) => Fetch::Failed(format!("unreadable answer: {e}")),
                }
            }
            Ok(r) if r.status() == 404 => Fetch::NotFound,
            Ok(r) if r.status().is_server_error() => {
                Fetch::Failed(format!("answer {}", r.status()))
            }
            Ok(r) => Fetch::Unavailable(format!("answer {}", r.status())),
            Err(e) => Fetch::Unavailable(e.to_string()),
        }
    }

    /// Whether the registry answers at all: `GET /schemas/types` answered below 500 (a
    /// registry without that call answers 404). Tells an id the registry keeps failing from
    /// a registry that is down.
    pub(in crate::stream::decode) fn answers(&self) -> bool {
        let mut request = self.agent.get(&format!("{}/schemas/types", self.base));
        if let Some(a) = &self.authorization {
            request = request.header("Authorization", a);
        }
        request.call().is_ok_and(|r| !r.status().is_server_error())
    }
}

/// Standard base64 with padding (RFC 4648), for the Basic credentials.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            match i <= chunk.len() {
                true => out.push(char::from(ABC[(n >> (18 - 6 * i)) as usize & 63])),
                false => out.push('='),
            }
        }
    }
    out
}

#[cfg(test)]
#[test]
fn base64_as_rfc_4648() {
    for (plain, coded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("user:pa ss", "dXNlcjpwYSBzcw=="),
    ] {
        assert_eq!(base64(plain.as_bytes()), coded);
    }
}
