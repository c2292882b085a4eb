//! A schema registry's REST API, the one call tally needs: `GET /schemas/ids/{id}`
//! (`{"schema": "<the schema as JSON text>", "schemaType": …}`; no `schemaType` is Avro).

use serde::Deserialize;

use crate::config::RegistryConfig;

/// What the registry said about an id.
pub(super) enum Fetch {
    /// The schema's text.
    Found(String),
    /// 404, or a schema that is not Avro.
    NotFound,
    /// No answer, or not one that says what the schema is (5xx, 401, a timeout).
    Unavailable(String),
}

pub(super) struct Registry {
    agent: ureq::Agent,
    base: String,
    /// `Basic …`, built once (never logged).
    authorization: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

impl Registry {
    pub(super) fn new(config: &RegistryConfig) -> Registry {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .build()
            .into();
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

    pub(super) fn schema(&self, id: u32) -> Fetch {
        let mut request = self.agent.get(&format!("{}/schemas/ids/{id}", self.base));
        if let Some(a) = &self.authorization {
            request = request.header("Authorization", a);
        }
        match request.call() {
            Ok(mut r) if r.status() == 200 => {
                match r
                    .body_mut()
                    .with_config()
                    .limit(1 << 20)
                    .read_json::<Answer>()
                {
                    Ok(a) if a.schema_type.as_deref().is_none_or(|t| t == "AVRO") => {
                        Fetch::Found(a.schema)
                    }
                    Ok(_) => Fetch::NotFound,
                    Err(e) => Fetch::Unavailable(format!("unreadable answer: {e}")),
                }
            }
            Ok(r) if r.status() == 404 => Fetch::NotFound,
            Ok(r) => Fetch::Unavailable(format!("answer {}", r.status())),
            Err(e) => Fetch::Unavailable(e.to_string()),
        }
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
