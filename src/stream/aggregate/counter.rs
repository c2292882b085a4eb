//! A counter compiled for the hot path: its key template, window cache, and the event field
//! indexes it reads; and the stages (decoder, counters) a consumer lane builds from the model.

use crate::key::KeyTemplate;
use crate::model::{CounterSpec, Kind};
use crate::stream::decode::Decoder;
use crate::window::WindowCache;

/// One counter, compiled for the hot path.
pub struct Counter {
    /// Name from the config, for metrics.
    pub name: String,
    pub(super) template: KeyTemplate,
    pub(super) windows: WindowCache,
    /// Indexes of this counter's dimensions in `Event::dims`.
    pub(super) dims: Vec<usize>,
    /// Index of the summed field in `Event::nums`; None counts 1 per event.
    pub(super) value: Option<usize>,
    pub(super) retention_ms: i64,
    /// `CounterSpec::expiry_spread_ms`: a new key's stored expiry is spread by its hash.
    pub(super) expiry_spread_ms: i64,
    /// Formatted time part of the cached window, and which window it belongs to.
    pub(super) time_text: String,
    pub(super) time_window: Option<i64>,
    pub(super) kind: HotKind,
}

/// A counter's kind, with the event field indexes it needs.
pub(super) enum HotKind {
    Count,
    /// Hash storage: the hash's key template and its formatted time part.
    Hash {
        template: KeyTemplate,
        time_text: String,
    },
    Distinct {
        member: usize,
        exact: bool,
    },
    Leaderboard {
        member: usize,
    },
}

/// The decoder and hot-path counters of `model`, as each consumer lane builds them.
pub fn stages(model: &crate::config::Model) -> (Decoder, Vec<Counter>) {
    stages_of(model, model.first_topic())
}

/// [`stages`] for the events of `topic`: the counters that do not read it skip them all.
pub fn stages_of(
    model: &crate::config::Model,
    topic: &crate::config::Topic,
) -> (Decoder, Vec<Counter>) {
    let decoder = Decoder::for_topic(model, topic);
    let counters = Counter::for_decoder(&model.counters, &decoder);
    (decoder, counters)
}

impl Counter {
    /// The hot-path counters of `specs`, reading their fields from events of `decoder`
    /// (built by [`Decoder::for_counters`] from the same specs).
    pub fn for_decoder(specs: &[CounterSpec], decoder: &Decoder) -> Vec<Counter> {
        specs
            .iter()
            .enumerate()
            .map(|(ci, spec)| {
                Counter::new(spec, |name| match decoder.field_index(name) {
                    Some(slot) => slot,
                    // A counter that does not read the decoder's topic skips every event
                    // (`Skips::unread`): its fields are never looked at.
                    None if !decoder.reads(ci) => 0,
                    None => panic!("Decoder::for_counters registers every field of the specs"),
                })
            })
            .collect()
    }

    /// Prepare a compiled counter for the hot path. `field_index` maps an event field name to
    /// its decoder index.
    pub fn new(spec: &CounterSpec, field_index: impl Fn(&str) -> usize) -> Counter {
        Counter {
            name: spec.name.clone(),
            template: spec.template.clone(),
            windows: WindowCache::new(spec.window),
            dims: spec.dimensions.iter().map(|d| field_index(d)).collect(),
            value: spec.value_field.as_deref().map(&field_index),
            retention_ms: spec.retention_ms,
            expiry_spread_ms: spec.expiry_spread_ms,
            time_text: String::new(),
            time_window: None,
            kind: match &spec.kind {
                Kind::Count => HotKind::Count,
                Kind::HashCount { hash } => HotKind::Hash {
                    template: hash.clone(),
                    time_text: String::new(),
                },
                Kind::Distinct { member, exact } => HotKind::Distinct {
                    member: field_index(member),
                    exact: *exact,
                },
                Kind::Leaderboard { member } => HotKind::Leaderboard {
                    member: field_index(member),
                },
            },
        }
    }

    /// Whether the counter writes with INCRBY (the fast path).
    pub(super) fn is_count(&self) -> bool {
        matches!(self.kind, HotKind::Count)
    }
}
