//! A counter's `output`: where and when its window results are published (the publisher itself
//! is the service's, `src/stream/publish/`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where and when a counter's window results go (see the README's "Window results downstream").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Kafka topic (on `kafka.brokers`) the window results are produced to; keyed by the
    /// counter's key, so a compacted topic keeps the last value of each (dimensions, window).
    pub topic: String,
    /// `final`: each key of a window once, when the window closes (and a correction for a late
    /// change); `updates`: also the changed keys of open windows, every publisher pass.
    #[serde(default)]
    pub when: OutputWhen,
    /// How long after its end a window waits for late events: it closes when the watermark
    /// (the highest event time seen, minus this) passes its end. Less than `retention`.
    #[serde(with = "humantime_serde", default)]
    pub allowed_lateness: Duration,
    /// A partition that is caught up and got no message for this long no longer holds the
    /// watermark back (an idle partition would otherwise keep every window open).
    #[serde(with = "humantime_serde", default = "default_idle_timeout")]
    pub idle_timeout: Duration,
    /// Leaderboards: how many of the best members a record lists (1 to 1000; unset: 10, as a
    /// query answers). Only for leaderboard counters.
    #[serde(default)]
    pub top: Option<usize>,
    /// What a change found after a window was published final (a late event within
    /// retention) produces in the output topic: a correction, or nothing.
    #[serde(default)]
    pub late: OutputLate,
    /// `late = "drop"`: the topic a dropped change is written to (its would-be correction,
    /// with headers saying why); unset: it is only counted.
    #[serde(default)]
    pub late_topic: Option<String>,
    /// When a published window's keys expire (window end + retention), produce a tombstone
    /// (its key, a null value) for each key the window published, so that a compacted topic
    /// forgets them too. Off by default: an upsert sink deletes its rows on a tombstone.
    #[serde(default)]
    pub tombstones: bool,
}

impl OutputConfig {
    /// The output `topic = "…"` alone: every other setting at its default, as the file reads it.
    pub fn to(topic: &str) -> OutputConfig {
        OutputConfig {
            topic: topic.to_string(),
            when: OutputWhen::default(),
            allowed_lateness: Duration::ZERO,
            idle_timeout: default_idle_timeout(),
            top: None,
            late: OutputLate::default(),
            late_topic: None,
            tombstones: false,
        }
    }
}

/// What a late change of a published window produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputLate {
    /// A correction record (`"correction": true`) in the output topic.
    #[default]
    Correct,
    /// Nothing in the output topic: a published window is final (Kafka Streams' suppress
    /// with `untilWindowCloses`). Redis still counts the event.
    Drop,
}

/// When window results are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputWhen {
    /// Once per key when the window closes (Kafka Streams' suppress, ksqlDB's EMIT FINAL).
    #[default]
    Final,
    /// Closed windows as `final`, plus the changed keys of open windows on every pass.
    Updates,
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}
