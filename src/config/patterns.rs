//! Topic patterns (`[[kafka.topics]]` with `pattern` instead of `name`): a regular expression
//! every topic of the cluster is matched against. The rules, pure and in one place:
//!
//! - the pattern matches the **whole** topic name (as Java's `subscribe(Pattern)` and Kafka
//!   Connect's `topics.regex` do): `orders-.*` reads `orders-eu`, not `old-orders-eu`; a leading
//!   `^` or trailing `$` changes nothing;
//! - internal topics (`__consumer_offsets`, any name starting with `__`) and the topics tally
//!   writes (dead-letter, window output and late-event topics) never match;
//! - a topic listed by name is read as listed, whatever the patterns; among patterns, the first
//!   listed that matches decides how a topic is decoded, so no topic is read twice;
//! - a matched topic that no counter reads is not consumed.

use regex::Regex;

use super::validate::{ensure, invalid};
use super::{Config, ConfigError, CounterConfig};

/// A pattern compiled for matching whole topic names.
#[derive(Debug, Clone)]
pub struct TopicPattern {
    /// Position in `kafka.topics`.
    pub index: usize,
    /// The pattern as written (what `counters[].topics` may name, and metric labels show).
    pub text: String,
    /// `^(?:text)$`.
    regex: Regex,
}

impl TopicPattern {
    /// Compile `text` (entry `index` of `kafka.topics`); a syntax error names its line and
    /// column in `text` as written.
    pub fn compile(index: usize, text: &str) -> Result<TopicPattern, ConfigError> {
        let at = format!("kafka.topics[{index}].pattern");
        if text.is_empty() {
            return Err(invalid(at, "an empty pattern matches no topic"));
        }
        if let Err(e) = regex_syntax::Parser::new().parse(text) {
            let (span, kind) = match &e {
                regex_syntax::Error::Parse(e) => (*e.span(), e.kind().to_string()),
                regex_syntax::Error::Translate(e) => (*e.span(), e.kind().to_string()),
                other => {
                    let start = regex_syntax::ast::Position::new(0, 1, 1);
                    (regex_syntax::ast::Span::splat(start), other.to_string())
                }
            };
            let (line, column) = (span.start.line, span.start.column);
            return Err(invalid(at, format!("{line}:{column}: {kind}")));
        }
        let regex = Regex::new(&format!("^(?:{text})$")).map_err(|e| invalid(at, e.to_string()))?;
        Ok(TopicPattern {
            index,
            text: text.to_string(),
            regex,
        })
    }

    /// Whether the whole of `topic` matches.
    pub fn matches(&self, topic: &str) -> bool {
        self.regex.is_match(topic)
    }

    /// Whether counter `c` counts topic `topic`, matched by this pattern: it lists no topics,
    /// lists this pattern, or lists `topic`.
    pub fn read_by(&self, c: &CounterConfig, topic: &str) -> bool {
        c.topics.is_empty() || c.topics.iter().any(|t| t == topic || *t == self.text)
    }

    /// Whether counter `c` may count some topic of this pattern: it lists no topics, this
    /// pattern, or a name the pattern matches.
    pub fn may_be_read_by(&self, c: &CounterConfig) -> bool {
        c.topics.is_empty() || c.topics.iter().any(|t| *t == self.text || self.matches(t))
    }
}

impl Config {
    /// Every `kafka.topics` pattern, compiled (validated: one that does not compile is left out).
    pub fn topic_patterns(&self) -> Vec<TopicPattern> {
        let entries = self.kafka.topics.iter().enumerate();
        entries
            .filter_map(|(i, t)| TopicPattern::compile(i, t.pattern.as_deref()?).ok())
            .collect()
    }

    /// What patterns cannot serve yet: the reconciler and window results need every topic up
    /// front (a recount of the listed topics alone, a watermark over part of the counter's
    /// partitions, would be wrong).
    pub(super) fn validate_pattern_limits(&self) -> Result<(), ConfigError> {
        let entries = self.kafka.topics.iter();
        let Some(first) = entries.clone().position(|t| t.pattern.is_some()) else {
            return Ok(());
        };
        let at = format!("kafka.topics[{first}].pattern");
        ensure(
            !self.jobs.reconcile.enabled,
            "jobs.reconcile.enabled",
            format!("the reconciler recounts the listed topics only, and {at} matches topics at run time: list them by name, or turn the reconciler off"),
        )?;
        let patterns = self.topic_patterns();
        for (i, c) in self.counters.iter().enumerate() {
            let Some(p) = patterns.iter().find(|p| p.may_be_read_by(c)) else {
                continue;
            };
            ensure(
                c.output.is_none(),
                format!("counters[{i}].output"),
                format!("window results need every topic a counter reads up front, and it reads topics matching kafka.topics[{}].pattern: list them by name, or limit the counter's topics", p.index),
            )?;
        }
        Ok(())
    }

    /// The topics tally writes: a pattern never matches them (reading its own output or dead
    /// letters would count events again).
    pub fn written_topics(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .topics()
            .iter()
            .filter_map(|t| t.decode.dead_letter_topic.as_deref())
            .collect();
        for c in &self.counters {
            if let Some(o) = &c.output {
                out.push(&o.topic);
                out.extend(o.late_topic.as_deref());
            }
        }
        out
    }

    /// The pattern (position in `patterns`) that decides how `topic` is read, if it is not
    /// listed by name, not internal, not one tally writes, and some pattern matches it.
    pub fn pattern_for(&self, patterns: &[TopicPattern], topic: &str) -> Option<usize> {
        let named = self.kafka.topics.iter().any(|t| t.name == topic);
        if named || topic.starts_with("__") || self.written_topics().contains(&topic) {
            return None;
        }
        patterns.iter().position(|p| p.matches(topic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> String {
        match TopicPattern::compile(2, text) {
            Err(ConfigError::Invalid { key, reason }) => {
                assert_eq!(key, "kafka.topics[2].pattern");
                reason
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_pattern_matches_whole_names() {
        let p = TopicPattern::compile(0, "orders-.*").unwrap();
        assert!(p.matches("orders-eu") && p.matches("orders-"));
        assert!(!p.matches("old-orders-eu") && !p.matches("orders"));
        let anchored = TopicPattern::compile(0, "^orders-(eu|us)$").unwrap();
        assert!(anchored.matches("orders-eu") && !anchored.matches("orders-eu2"));
        // An alternation is matched whole too, not as `^a|b$`.
        let either = TopicPattern::compile(0, "a|b").unwrap();
        assert!(either.matches("b") && !either.matches("ab") && !either.matches("ba"));
    }

    #[test]
    fn an_invalid_pattern_is_refused_with_its_position() {
        assert_eq!(refusal("orders-(eu"), "1:8: unclosed group");
        assert!(
            refusal("a{2,1}").starts_with("1:2: "),
            "{}",
            refusal("a{2,1}")
        );
        assert!(
            refusal("ok|[z-a]").starts_with("1:5: "),
            "{}",
            refusal("ok|[z-a]")
        );
        assert_eq!(refusal(""), "an empty pattern matches no topic");
    }
}
