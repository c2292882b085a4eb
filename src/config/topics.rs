//! `[[kafka.topics]]`: several topics in one process, each with its own decoding, listed by
//! name or matched by a pattern (`patterns.rs`). The single-topic form (`kafka.topic` with
//! `[decode]`) is the one-element list; [`Config::topics`] resolves either form into the list
//! every path reads.

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::decode::{CompiledDecode, DecodeConfig};
use super::patterns::TopicPattern;
use super::validate::{ensure, invalid, legal_topic};
use super::{Config, ConfigError, CounterConfig, KafkaConfig};

/// One topic of `kafka.topics`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// The topic's name (or set `pattern`).
    #[serde(default)]
    pub name: String,
    /// A regular expression matched against the whole name of every topic of the cluster,
    /// instead of `name`: each match is read as a topic of its own (see `patterns.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// How its messages become events. None: `[decode]`. A topic's own `decode` replaces
    /// `[decode]` as a whole (keys it does not set take their defaults, not `[decode]`'s).
    #[serde(default)]
    pub decode: Option<DecodeConfig>,
}

/// A topic the stream reads, resolved from either form.
#[derive(Debug, Clone, Copy)]
pub struct TopicRef<'a> {
    /// Position in the list (`kafka.topics[i]`; 0 for `kafka.topic`).
    pub index: usize,
    /// The topic's name; a pattern's text when `pattern`.
    pub name: &'a str,
    /// Whether this entry is a pattern (`name` its text), matching topics listed at run time.
    pub pattern: bool,
    /// Its decoding: its own, or `[decode]`.
    pub decode: &'a DecodeConfig,
    /// Whether `decode` is the topic's own (its errors then name `kafka.topics[i].decode`).
    pub own_decode: bool,
}

impl TopicRef<'_> {
    /// Whether counter `c` counts (some of) this entry's events: see [`counter_reads`], and
    /// [`TopicPattern::may_be_read_by`] for a pattern.
    pub fn read_by(&self, c: &CounterConfig) -> bool {
        match self.pattern {
            false => counter_reads(c, self.name),
            true => TopicPattern::compile(self.index, self.name).is_ok_and(|p| p.may_be_read_by(c)),
        }
    }

    /// The configuration key its decode settings are read from (`decode` or
    /// `kafka.topics[i].decode`).
    pub fn decode_key(&self) -> String {
        match self.own_decode {
            true => format!("kafka.topics[{}].decode", self.index),
            false => "decode".into(),
        }
    }
}

/// Whether counter `c` counts the events of `topic`.
pub fn counter_reads(c: &CounterConfig, topic: &str) -> bool {
    c.topics.is_empty() || c.topics.iter().any(|t| t == topic)
}

impl Config {
    /// Every topic the stream reads, in order: `kafka.topics`, or the one `kafka.topic` with
    /// `[decode]`. The first is where deferred hits are produced.
    pub fn topics(&self) -> Vec<TopicRef<'_>> {
        if self.kafka.topics.is_empty() {
            return vec![TopicRef {
                index: 0,
                name: &self.kafka.topic,
                pattern: false,
                decode: &self.decode,
                own_decode: false,
            }];
        }
        self.kafka
            .topics
            .iter()
            .enumerate()
            .map(|(index, t)| TopicRef {
                index,
                name: t.pattern.as_deref().unwrap_or(&t.name),
                pattern: t.pattern.is_some(),
                decode: t.decode.as_ref().unwrap_or(&self.decode),
                own_decode: t.decode.is_some(),
            })
            .collect()
    }

    /// The topic list's own rules (legal, distinct names; `kafka.topic` not contradicting it),
    /// then each topic's decoding, its errors named after where it is written; returns the
    /// decoding of each entry of [`Config::topics`], compiled.
    pub(super) fn validate_topics(&self) -> Result<Vec<Arc<CompiledDecode>>, ConfigError> {
        let list = &self.kafka.topics;
        let default_topic = KafkaConfig::default().topic;
        if let Some(first) = list.first() {
            ensure(
                self.kafka.topic == default_topic || self.kafka.topic == first.name,
                "kafka.topic",
                "set kafka.topic or kafka.topics, not both (with kafka.topics, leave kafka.topic unset: the first listed topic is where deferred hits go)",
            )?;
        }
        let mut seen = HashSet::new();
        for (i, t) in list.iter().enumerate() {
            let at = format!("kafka.topics[{i}].name");
            if let Some(pattern) = &t.pattern {
                ensure(t.name.is_empty(), &at, "set name or pattern, not both")?;
                TopicPattern::compile(i, pattern)?;
                let twice = format!("pattern `{pattern}` is listed twice");
                let at = format!("kafka.topics[{i}].pattern");
                ensure(seen.insert(format!("/{pattern}")), at, twice)?;
                continue;
            }
            ensure(
                legal_topic(&t.name),
                &at,
                "a Kafka topic name: 1 to 249 of letters, digits, '.', '_', '-' (or set pattern instead)",
            )?;
            let twice = format!("`{}` is listed twice", t.name);
            ensure(seen.insert(t.name.clone()), at, twice)?;
        }
        self.validate_pattern_limits()?;
        let shared = Arc::new(self.decode.compile()?);
        let mut decodes = Vec::new();
        for topic in self.topics() {
            decodes.push(match topic.own_decode {
                true => {
                    let key = topic.decode_key();
                    Arc::new(topic.decode.compile().map_err(|e| e.within(&key))?)
                }
                false => shared.clone(),
            });
        }
        Ok(decodes)
    }

    /// `counters[i].topics` names topics that are read (listed, a pattern as written, or a name
    /// a pattern matches), and every entry is read by a counter.
    pub(super) fn validate_counter_topics(&self) -> Result<(), ConfigError> {
        let topics = self.topics();
        let patterns = self.topic_patterns();
        for (i, c) in self.counters.iter().enumerate() {
            for name in &c.topics {
                let listed = topics.iter().any(|t| t.name == name);
                ensure(
                    listed || patterns.iter().any(|p| p.matches(name)),
                    format!("counters[{i}].topics"),
                    format!(
                        "`{name}` is not a topic tally reads (kafka.topic or kafka.topics[].name), a pattern of kafka.topics[].pattern, or a name one matches"
                    ),
                )?;
            }
        }
        for t in &topics {
            let key = match self.kafka.topics.is_empty() {
                true => "kafka.topic".to_string(),
                false => format!("kafka.topics[{}]", t.index),
            };
            let what = match t.pattern {
                true => format!("topics matching `{}`", t.name),
                false => format!("`{}`", t.name),
            };
            ensure(
                self.counters.iter().any(|c| t.read_by(c)),
                key,
                format!("no counter reads {what}: add it to a counter's topics, or remove it"),
            )?;
        }
        Ok(())
    }

    /// Whether some counter does not read every topic (the decoder then flags, per event, the
    /// counters that do not take it).
    pub(super) fn restricts_topics(&self) -> bool {
        let topics = self.topics();
        self.counters.iter().any(|c| {
            topics.iter().any(|t| match t.pattern {
                // Which of its topics a counter reads is known per topic, at run time.
                true => !c.topics.is_empty(),
                false => !t.read_by(c),
            })
        })
    }
}

impl ConfigError {
    /// The same refusal of a `[decode]` key written under `at` instead (`decode.format` →
    /// `kafka.topics[1].decode.format`).
    pub(super) fn within(self, at: &str) -> ConfigError {
        match self {
            ConfigError::Invalid { key, reason } => {
                let key = match key.strip_prefix("decode") {
                    Some(rest) => format!("{at}{rest}"),
                    None => key,
                };
                invalid(key, reason)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ConfigError};

    const TWO: &str = r#"
[kafka]
group_id = "g"
[[kafka.topics]]
name = "views"
[[kafka.topics]]
name = "clicks"
decode = { time_field = "at", fields = { app = "req.app" } }
[decode]
time_field = "ts"
[[counters]]
name = "both"
dimensions = ["app"]
key = "b:{app}:{yyyyMMddHH}"
window = "1h"
[[counters]]
name = "pages"
dimensions = ["page"]
topics = ["views"]
key = "p:{page}:{yyyyMMddHH}"
window = "1h"
"#;

    fn refusal(text: &str) -> (String, String) {
        let config: Config = toml::from_str(text).unwrap();
        match config.validate() {
            Err(ConfigError::Invalid { key, reason }) => (key, reason),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_single_topic_form_is_one_topic_decoded_per_decode() {
        let config = Config::default();
        let topics = config.topics();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0].name, "events");
        assert_eq!(topics[0].decode_key(), "decode");
        config.validate().unwrap();
    }

    #[test]
    fn each_topic_has_its_decoding_and_the_counters_that_read_it() {
        let config: Config = toml::from_str(TWO).unwrap();
        config.validate().unwrap();
        let topics = config.topics();
        assert_eq!(topics[0].decode.time_field.as_deref(), Some("ts"));
        assert_eq!(topics[1].decode.time_field.as_deref(), Some("at"));
        assert_eq!(topics[1].decode_key(), "kafka.topics[1].decode");
        let pages = &config.counters[1];
        assert!(super::counter_reads(pages, "views") && !super::counter_reads(pages, "clicks"));
    }

    #[test]
    fn refusals_name_the_key() {
        let unknown = TWO.replace(r#"topics = ["views"]"#, r#"topics = ["view"]"#);
        let (key, reason) = refusal(&unknown);
        assert_eq!(key, "counters[1].topics");
        assert!(reason.contains("`view` is not a topic"), "{reason}");

        let avro = TWO.replace(
            "decode = { time_field",
            r#"decode = { format = "avro", time_field"#,
        );
        assert_eq!(refusal(&avro).0, "kafka.topics[1].decode.format");

        let twice = TWO.replace(r#"name = "clicks""#, r#"name = "views""#);
        assert_eq!(refusal(&twice).0, "kafka.topics[1].name");

        let both = TWO.replace("group_id = \"g\"", "group_id = \"g\"\ntopic = \"other\"");
        assert_eq!(refusal(&both).0, "kafka.topic");
        let same = TWO.replace("group_id = \"g\"", "group_id = \"g\"\ntopic = \"views\"");
        toml::from_str::<Config>(&same).unwrap().validate().unwrap();

        let unread = TWO.replace("name = \"both\"", "name = \"both\"\ntopics = [\"views\"]");
        let (key, reason) = refusal(&unread);
        assert_eq!(key, "kafka.topics[1]");
        assert!(reason.contains("no counter reads `clicks`"), "{reason}");

        // The time field of a topic the counter reads may not be one of its dimensions.
        let clash = TWO
            .replace(r#"dimensions = ["app"]"#, r#"dimensions = ["app", "at"]"#)
            .replace("b:{app}:", "b:{app}:{at}:");
        let (key, reason) = refusal(&clash);
        assert_eq!(key, "counters[0].dimensions");
        assert!(
            reason.contains("kafka.topics[1].decode.time_field"),
            "{reason}"
        );
    }

    const PATTERNS: &str = r#"
[kafka]
group_id = "g"
[[kafka.topics]]
name = "views"
[[kafka.topics]]
pattern = "orders-.*"
decode = { time_field = "at", fields = { app = "order.app" } }
[[counters]]
name = "both"
dimensions = ["app"]
key = "b:{app}:{yyyyMMddHH}"
window = "1h"
[[counters]]
name = "orders"
dimensions = ["app"]
topics = ["orders-.*"]
key = "o:{app}:{yyyyMMddHH}"
window = "1h"
"#;

    #[test]
    fn a_pattern_entry_is_checked_and_resolved_per_topic() {
        let config: Config = toml::from_str(PATTERNS).unwrap();
        config.validate().unwrap();
        let model = super::super::Model::compile(config).unwrap();
        assert_eq!(model.topics.len(), 1, "only `views` is listed");
        let eu = model.pattern_topic("orders-eu").expect("matched, read");
        assert_eq!(eu.decode.config.time_field.as_deref(), Some("at"));
        assert_eq!(eu.reads, vec![true, true]);
        assert!(model.pattern_topic("views").is_none(), "listed by name");
        assert!(
            model.pattern_topic("old-orders-eu").is_none(),
            "whole names"
        );
        assert!(model.pattern_topic("__orders-x").is_none());
        assert!(model.defer_topic().is_some_and(|t| t.name == "views"));

        // A counter may list a name the pattern matches: it reads that topic only.
        let one = PATTERNS.replace(r#"topics = ["orders-.*"]"#, r#"topics = ["orders-eu"]"#);
        let model = super::super::Model::compile(toml::from_str(&one).unwrap()).unwrap();
        assert_eq!(
            model.pattern_topic("orders-us").unwrap().reads,
            vec![true, false]
        );
        assert_eq!(
            model.pattern_topic("orders-eu").unwrap().reads,
            vec![true, true]
        );
    }

    #[test]
    fn pattern_refusals_name_the_key() {
        let bad = PATTERNS.replace(r#"pattern = "orders-.*""#, r#"pattern = "orders-(eu""#);
        let (key, reason) = refusal(&bad);
        assert_eq!(key, "kafka.topics[1].pattern");
        assert_eq!(reason, "1:8: unclosed group");

        let both = PATTERNS.replace(
            r#"pattern = "orders-.*""#,
            "pattern = \"orders-.*\"\nname = \"x\"",
        );
        assert_eq!(
            refusal(&both),
            (
                "kafka.topics[1].name".into(),
                "set name or pattern, not both".into()
            )
        );

        let unresolved = PATTERNS.replace(r#"topics = ["orders-.*"]"#, r#"topics = ["clicks"]"#);
        let (key, reason) = refusal(&unresolved);
        assert_eq!(key, "counters[1].topics");
        assert!(reason.contains("`clicks` is not a topic"), "{reason}");

        let unread = PATTERNS
            .replace("name = \"both\"", "name = \"both\"\ntopics = [\"views\"]")
            .replace(r#"topics = ["orders-.*"]"#, r#"topics = ["views"]"#);
        let (key, reason) = refusal(&unread);
        assert_eq!(key, "kafka.topics[1]");
        assert!(
            reason.contains("no counter reads topics matching `orders-.*`"),
            "{reason}"
        );

        let reconcile = format!("{PATTERNS}\n[jobs.reconcile]\nenabled = true\n");
        assert_eq!(refusal(&reconcile).0, "jobs.reconcile.enabled");
    }
}
