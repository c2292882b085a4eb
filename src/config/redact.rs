//! Secrets stay out of what tally prints: `tally check` shows the configuration with passwords,
//! URL credentials, secret librdkafka properties and the HTTP token replaced by `***`, and
//! configuration errors never echo a secret value. User names and hosts are kept, so the output
//! still says where tally connects and as whom.

use figment::error::{Actual, Kind};

use super::Config;

use tally_counters::config::is_secret_word;
pub use tally_counters::config::{redact_url, MASK};

/// Whether a librdkafka property holds a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.keystore.password`, `sasl.oauthbearer.client.secret`, an inline private key, …).
pub fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || matches!(
            key.as_str(),
            "ssl.key.pem" | "sasl.oauthbearer.config" | "sasl.jaas.config"
        )
}

/// Free text (a parser's message, which may quote the offending line): URL credentials masked,
/// and on a line naming a secret (`password = "…"`) everything after the first `=`.
pub fn redact_text(text: &str) -> String {
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let line = redact_urls_in(line);
            match line.split_once('=') {
                Some((name, _)) if is_secret_word(name) => format!("{name}= {MASK}"),
                _ => line,
            }
        })
        .collect();
    lines.join("\n")
}

/// Every `scheme://…` word in `line` through [`redact_url`].
fn redact_urls_in(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("://") {
        // The scheme starts after the last character that cannot be part of one (which may
        // be several bytes long: step over all of it).
        let start = rest[..i]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |(j, c)| j + c.len_utf8());
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ','))
            .map_or(rest.len(), |j| i + j);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether the value at a configuration path may be a secret: passwords, tokens, Redis URLs and
/// seed nodes, secret librdkafka properties, and whole sections or maps given as one value.
fn is_secret_path(path: &[String]) -> bool {
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    match parts.as_slice() {
        [] | [_] => true,
        ["redis", "url" | "nodes", ..] => true,
        ["kafka", "properties"] => true,
        ["kafka", "properties", key, ..] => is_secret_property(key),
        _ => parts.iter().any(|p| is_secret_word(p)),
    }
}

/// A loading error (there may be several, chained) with no secret value in its message.
pub fn figment_error(error: figment::Error) -> figment::Error {
    let hidden = || Actual::Other(format!("a value not shown ({MASK})"));
    let errors: Vec<figment::Error> = error
        .into_iter()
        .map(|mut e| {
            let secret = is_secret_path(&e.path);
            e.kind = match e.kind {
                // Parse errors quote the offending line; keep the rest of what they say.
                Kind::Message(m) => Kind::Message(redact_text(&m)),
                Kind::InvalidType(_, expected) if secret => Kind::InvalidType(hidden(), expected),
                Kind::InvalidValue(_, expected) if secret => Kind::InvalidValue(hidden(), expected),
                Kind::UnknownVariant(_, expected) if secret => {
                    Kind::UnknownVariant(MASK.to_string(), expected)
                }
                Kind::Unsupported(_) if secret => Kind::Unsupported(hidden()),
                Kind::UnsupportedKey(_, expected) if secret => {
                    Kind::UnsupportedKey(hidden(), expected)
                }
                // Elsewhere a string may still hold a URL or `password=…`.
                Kind::InvalidType(Actual::Str(v), expected) => {
                    Kind::InvalidType(Actual::Str(redact_text(&v)), expected)
                }
                Kind::InvalidValue(Actual::Str(v), expected) => {
                    Kind::InvalidValue(Actual::Str(redact_text(&v)), expected)
                }
                kind => kind,
            };
            e
        })
        .collect();
    errors
        .into_iter()
        .rev()
        .reduce(|older, newer| older.chain(newer))
        .expect("an error holds at least itself")
}

impl Config {
    /// This configuration with every secret replaced by `***`, for printing.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        c.redis.url = redact_url(&c.redis.url);
        for node in &mut c.redis.nodes {
            *node = redact_url(node);
        }
        if c.redis.password.is_some() {
            c.redis.password = Some(MASK.to_string());
        }
        if c.http.token.is_some() {
            c.http.token = Some(MASK.to_string());
        }
        if c.http.admin_token.is_some() {
            c.http.admin_token = Some(MASK.to_string());
        }
        for (key, value) in &mut c.kafka.properties {
            if is_secret_property(key) {
                *value = MASK.to_string();
            }
        }
        let own = c.kafka.topics.iter_mut().filter_map(|t| t.decode.as_mut());
        for decode in std::iter::once(&mut c.decode).chain(own) {
            if let Some(r) = &mut decode.schema_registry {
                r.url = redact_url(&r.url);
                if r.password.is_some() {
                    r.password = Some(MASK.to_string());
                }
            }
        }
        c
    }

    /// Which Redis this configuration talks to, without secrets: for errors a person reads
    /// ("tally: redis redis://cache:6379: connection refused").
    pub fn redis_target(&self) -> String {
        use tally_counters::config::RedisMode;
        let r = &self.redis;
        match r.mode {
            RedisMode::Standalone => redact_url(&r.url),
            RedisMode::Cluster if r.nodes.is_empty() => format!("cluster {}", redact_url(&r.url)),
            RedisMode::Cluster => format!(
                "cluster {}",
                r.nodes
                    .iter()
                    .map(|n| redact_url(n))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            RedisMode::Sentinel => format!(
                "sentinel master {:?} via {}",
                r.master_name,
                r.sentinels
                    .iter()
                    .map(|n| redact_url(n))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keeps_everything_but_secrets() {
        let text = "at line 3\n3 | password = \"hunter2\n  |  ^\nsee redis://u:pw@h:1/0, or not";
        let out = redact_text(text);
        assert!(!out.contains("hunter2") && !out.contains("pw@"), "{out}");
        assert!(
            out.contains("at line 3") && out.contains("redis://u:***@h:1/0,"),
            "{out}"
        );
    }

    #[test]
    fn the_schema_registry_password_is_masked() {
        let mut c = Config::default();
        c.decode.schema_registry = Some(crate::config::RegistryConfig {
            url: "https://u:pw@registry:8081".into(),
            username: Some("u".into()),
            password: Some("hunter2".into()),
            timeout: std::time::Duration::from_secs(1),
            ca_file: None,
        });
        let shown = format!("{:?}", c.redacted());
        assert!(
            !shown.contains("hunter2") && !shown.contains(":pw@"),
            "{shown}"
        );
        assert!(shown.contains("registry:8081"), "{shown}");
    }

    #[test]
    fn secret_properties() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "ssl.key.pem",
        ] {
            assert!(is_secret_property(key), "{key}");
        }
        assert!(!is_secret_property("sasl.username"));
        assert!(!is_secret_property("session.timeout.ms"));
    }

    #[test]
    fn urls_after_multibyte_characters_are_found() {
        // Found by the config fuzz target: a multi-byte character right before the scheme.
        let text = "ky='\u{51413}eis://\u{51413}:pw@host";
        let out = redact_text(text);
        assert!(!out.contains("pw@"), "{out}");
    }
}
