//! The counter model: what a counter is, where its keys live, and the names of tally's own state
//! keys. Pure — no I/O, no async runtime, no Kafka or Redis client — so every path (the stream
//! pipeline, validation, queries, `tally state`, the request path) compiles a counter here
//! once and computes keys and expiries the same way.

mod expiry;
pub mod layout;
mod lookup;
pub mod overlap;
pub mod state_keys;

pub use expiry::{default_spread_ms, expire_at, stored_expire_at, DEFAULT_SPREAD_CAP_MS};
pub use lookup::{check_at, LookupError};

/// How many members of a leaderboard a read lists unless told otherwise (queries, and window
/// results without `output.top`).
pub const DEFAULT_TOP: usize = 10;

use crate::config::CounterConfig;
use crate::key::{KeyTemplate, TemplateError};
use crate::window::{Window, WindowError, WindowSpec};

/// One counter, compiled from its configuration.
#[derive(Debug, Clone)]
pub struct CounterSpec {
    /// Name from the config: metric label and query name.
    pub name: String,
    /// Event fields the counter groups by, in template order.
    pub dimensions: Vec<String>,
    /// Window length and time zone.
    pub window: WindowSpec,
    /// Key template: literal text, dimension placeholders, one time placeholder.
    pub template: KeyTemplate,
    /// Extra key lifetime after the window ends, ms.
    pub retention_ms: i64,
    /// Up to how much later than window end + retention a key's stored expiry lies, ms (a
    /// deterministic per-key offset, see [`stored_expire_at`]); 0: every key of a window expires
    /// at the same instant.
    pub expiry_spread_ms: i64,
    /// Integer field summed instead of counting 1 per event.
    pub value_field: Option<String>,
    /// What the counter keeps.
    pub kind: Kind,
    /// Where its closed windows are published, if anywhere.
    pub output: Option<crate::config::OutputConfig>,
    /// The CEL condition an event meets to count here (compiled by the service).
    pub filter: Option<String>,
}

/// What a counter keeps per (dimensions, window), compiled.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A count or sum in one string key (INCRBY).
    Count,
    /// A count or sum in a field of one hash per (counter, window, shard) (HINCRBY); the hash's
    /// key template has the time placeholder and no dimensions.
    HashCount {
        /// Template of the hash's key.
        hash: KeyTemplate,
    },
    /// Distinct values of `member` (PFADD when `exact` is false, SADD when true).
    Distinct {
        /// The counted field.
        member: String,
        /// A set instead of a HyperLogLog.
        exact: bool,
    },
    /// Members scored by count or by the sum of `value_field` (ZINCRBY).
    Leaderboard {
        /// The ranked field.
        member: String,
    },
}

/// Why a counter's configuration does not compile; `field()` names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not an IANA time zone.
    #[error("`{0}` is not an IANA time zone")]
    TimeZone(String),
    /// The window length is not usable.
    #[error(transparent)]
    Window(#[from] WindowError),
    /// The key template is not injective or malformed.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The kind's settings do not fit together.
    #[error("{1}")]
    Kind(&'static str, String),
}

impl SpecError {
    /// The counter field the error is about (`timezone`, `window`, `key`).
    pub fn field(&self) -> &'static str {
        match self {
            SpecError::TimeZone(_) => "timezone",
            SpecError::Window(_) => "window",
            SpecError::Template(_) => "key",
            SpecError::Kind(field, _) => field,
        }
    }
}

impl CounterSpec {
    /// Compile one counter's configuration.
    pub fn compile(config: &CounterConfig) -> Result<CounterSpec, SpecError> {
        let tz: chrono_tz::Tz = config
            .timezone
            .parse()
            .map_err(|_| SpecError::TimeZone(config.timezone.clone()))?;
        let window = WindowSpec::new(config.window, tz)?;
        let template = KeyTemplate::parse(&config.key, &config.dimensions, &window)?;
        let kind = compile_kind(config, &window)?;
        Ok(CounterSpec {
            name: config.name.clone(),
            dimensions: config.dimensions.clone(),
            window,
            template,
            retention_ms: i64::try_from(config.retention.as_millis()).unwrap_or(i64::MAX),
            expiry_spread_ms: expiry::spread_ms(config),
            value_field: config.value_field.clone(),
            kind,
            output: config.output.clone(),
            filter: config.filter.clone(),
        })
    }

    /// Where the value of `values` (in dimension order) for the window holding `at_ms` lives:
    /// the stored key, the hash field for hash storage, and the window. The stream path writes
    /// exactly here (`aggregate`'s target renders the same bytes).
    pub fn location_at(
        &self,
        values: &[&str],
        at_ms: i64,
        layout: &layout::Layout,
    ) -> (Vec<u8>, Option<Vec<u8>>, Window) {
        let Kind::HashCount { hash } = &self.kind else {
            let (key, window) = self.key_at(values, at_ms, layout);
            return (key, None, window);
        };
        let window = self.window.window_of(at_ms);
        let shard = self.shard_of(values, layout);
        let mut time = String::new();
        hash.format_time(window.local_start, &mut time);
        let mut key = Vec::new();
        hash.render(&mut key, &[], &time);
        layout.append_tag(&mut key, shard);
        let mut field = Vec::new();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                field.push(b':');
            }
            crate::key::escape_into(&mut field, v);
        }
        (key, Some(field), window)
    }

    /// The expiry tally stores on a key this counter wrote (`stored`, with its cluster tag if
    /// any): [`stored_expire_at`] of its window end + retention, read from the key's time. None
    /// when the key is not one of this counter's.
    pub fn stored_expire_at_of_key(&self, stored: &[u8]) -> Option<i64> {
        self.window_of_key(stored)
            .map(|window| self.stored_expire_at(stored, window.end_ms))
    }

    /// When a key this counter wrote (`stored`, with its cluster tag if any) should expire:
    /// window end + retention, read from the key's time. None when the key is not one of this
    /// counter's.
    pub fn expire_at_of_key(&self, stored: &[u8]) -> Option<i64> {
        self.window_of_key(stored)
            .map(|window| self.expire_at(window.end_ms))
    }

    /// The window of a key this counter wrote (`stored`, with its cluster tag if any), read from
    /// the key's time; None when the key is not one of this counter's.
    pub fn window_of_key(&self, stored: &[u8]) -> Option<Window> {
        let local = self.written_template().local_start_of(untagged(stored))?;
        let tz = self.window.tz();
        let start = chrono::TimeZone::from_local_datetime(&tz, &local)
            .earliest()?
            .timestamp_millis();
        let window = self.window.window_of(start);
        (window.start_ms == start).then_some(window)
    }

    /// The template of the keys the counter writes: the hash's for hash storage, else `template`.
    pub fn written_template(&self) -> &KeyTemplate {
        match &self.kind {
            Kind::HashCount { hash } => hash,
            _ => &self.template,
        }
    }

    /// When a key of the window ending at `window_end_ms` expires (Unix ms): the one place that
    /// computes it.
    pub fn expire_at(&self, window_end_ms: i64) -> i64 {
        expire_at(window_end_ms, self.retention_ms)
    }

    /// The expiry tally stores on `stored` (a key this counter writes, with its cluster tag if
    /// any) of the window ending at `window_end_ms`: [`stored_expire_at`].
    pub fn stored_expire_at(&self, stored: &[u8], window_end_ms: i64) -> i64 {
        stored_expire_at(stored, self.expire_at(window_end_ms), self.expiry_spread_ms)
    }

    /// The stored key of `values` (in dimension order) for the window holding `at_ms`, and that
    /// window.
    pub fn key_at(
        &self,
        values: &[&str],
        at_ms: i64,
        layout: &layout::Layout,
    ) -> (Vec<u8>, Window) {
        let window = self.window.window_of(at_ms);
        let mut time = String::new();
        self.template.format_time(window.local_start, &mut time);
        let mut key = Vec::new();
        self.template.render(&mut key, values, &time);
        layout.append_tag(&mut key, self.shard_of(values, layout));
        (key, window)
    }

    /// The shard (cluster hash-tag group) of the series `values`: the same for every window.
    pub fn shard_of(&self, values: &[&str], layout: &layout::Layout) -> u32 {
        layout::series_shard(&self.name, values, layout.shards())
    }
}

/// `stored` without the cluster hash tag the layout appends (`:{tag}`).
pub fn untagged(stored: &[u8]) -> &[u8] {
    match stored.iter().rposition(|&b| b == b'{') {
        Some(open) if open > 0 && stored[open - 1] == b':' && stored.ends_with(b"}") => {
            &stored[..open - 1]
        }
        _ => stored,
    }
}

fn compile_kind(config: &CounterConfig, window: &WindowSpec) -> Result<Kind, SpecError> {
    use crate::config::{CounterKind, DistinctMode, Storage};
    let kind_err = |field: &'static str, why: &str| Err(SpecError::Kind(field, why.to_string()));
    if config.storage == Storage::Hash && config.kind != CounterKind::Count {
        return kind_err("storage", "hash storage is for count counters");
    }
    if config.hash_key.is_some() && config.storage != Storage::Hash {
        return kind_err("hash_key", "hash_key needs storage = \"hash\"");
    }
    let member = || match &config.member {
        Some(m) if !m.is_empty() => Ok(m.clone()),
        _ => Err(SpecError::Kind(
            "member",
            "distinct and leaderboard counters name the `member` field".into(),
        )),
    };
    Ok(match config.kind {
        CounterKind::Count => {
            if config.member.is_some() {
                return kind_err(
                    "member",
                    "a count counter has no member (use kind = \"distinct\" or \"leaderboard\")",
                );
            }
            match config.storage {
                Storage::String => Kind::Count,
                Storage::Hash => {
                    let Some(hash) = &config.hash_key else {
                        return kind_err("hash_key", "hash storage names the hash's key template, e.g. `flow:h:{yyyyMMddHH}`");
                    };
                    Kind::HashCount {
                        hash: KeyTemplate::parse(hash, &[], window)?,
                    }
                }
            }
        }
        CounterKind::Distinct => {
            if config.value_field.is_some() {
                return kind_err(
                    "value_field",
                    "a distinct counter counts values of `member`; it sums nothing",
                );
            }
            let member = member()?;
            if config.dimensions.contains(&member) {
                return kind_err("member", "the member must not also be a dimension");
            }
            Kind::Distinct {
                member,
                exact: config.distinct == DistinctMode::Exact,
            }
        }
        CounterKind::Leaderboard => {
            let member = member()?;
            if config.dimensions.contains(&member) {
                return kind_err("member", "the member must not also be a dimension");
            }
            Kind::Leaderboard { member }
        }
    })
}

/// Compile every counter of a configuration, in order.
pub fn compile_all(counters: &[CounterConfig]) -> Result<Vec<CounterSpec>, SpecError> {
    counters.iter().map(CounterSpec::compile).collect()
}
