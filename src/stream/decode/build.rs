//! The decoder a model needs: its counters' fields, and the rules of their filters and
//! derived fields.

use crate::config::{DecodeConfig, Program, Topic};
use crate::model::{CounterSpec, Kind};

use super::{rules, Decoder, FieldRole};

impl Decoder {
    /// The decoder for `counters`: every field they group by, rank or sum, once each, in
    /// counter order (dimensions, then the member, then the value field), then the fields their
    /// filters and derived fields read. With filters or derived fields, [`rules::Rules`] decide
    /// per counter (see there).
    pub fn for_counters(config: &DecodeConfig, counters: &[CounterSpec]) -> Decoder {
        Decoder::reading(config, counters, &vec![true; counters.len()])
    }

    /// The decoder of `topic`'s events: [`Decoder::for_counters`] of the counters that read
    /// it. The others skip every event (`Skips::unread`); their fields are not read at all, so
    /// an event of this topic need not carry them.
    pub fn for_topic(topic: &Topic, counters: &[CounterSpec]) -> Decoder {
        Decoder::reading(&topic.decode, counters, &topic.reads)
    }

    /// Whether counter `ci` (model order) takes this decoder's events at all.
    pub fn reads(&self, ci: usize) -> bool {
        self.rules.unread & rules::counter_bit(ci) == 0
    }

    /// The decoder of the counters `reads` marks (by counter, in model order).
    fn reading(config: &DecodeConfig, counters: &[CounterSpec], reads: &[bool]) -> Decoder {
        fn add(fields: &mut Vec<(String, FieldRole)>, name: &str, role: FieldRole) {
            if !fields.iter().any(|(n, _)| n == name) {
                fields.push((name.to_string(), role));
            }
        }
        let read = |ci: &usize| reads.get(*ci).copied().unwrap_or(true);
        let unread = (0..counters.len())
            .filter(|ci| !read(ci))
            .fold(0, |m, ci| m | rules::counter_bit(ci));
        let mut fields = Vec::new();
        for (_, c) in counters.iter().enumerate().filter(|(ci, _)| read(ci)) {
            for (name, role) in own_fields(c) {
                add(&mut fields, name, role);
            }
        }
        let compiled = "filters and derived fields are compiled when the model is validated";
        let filters: Vec<Option<Program>> = counters
            .iter()
            .enumerate()
            .map(|(ci, c)| match read(&ci) {
                true => c
                    .filter
                    .as_deref()
                    .map(|f| Program::filter(f).expect(compiled)),
                false => None,
            })
            .collect();
        for v in filters.iter().flatten().flat_map(|p| p.vars()) {
            add(&mut fields, v, FieldRole::Filter);
        }
        let derived: Vec<(String, Program)> = config
            .derive
            .iter()
            .filter(|(name, _)| fields.iter().any(|(n, _)| n == *name))
            .map(|(name, text)| (name.clone(), Program::compile(text).expect(compiled)))
            .collect();
        for v in derived.iter().flat_map(|(_, p)| p.vars()) {
            add(&mut fields, v, FieldRole::Filter);
        }
        let mut decoder = Decoder::new(config, &fields);
        if filters.iter().all(Option::is_none) && derived.is_empty() && unread == 0 {
            return decoder;
        }
        let d = &decoder;
        let slot = |name: &str| d.field_index(name).expect("every field was added above");
        // Fields of counters that do not filter stay required (the event time too); derived
        // fields never are: a counter whose derived field fails skips the event.
        let mut optional = (0..d.names.len()).fold(0, |m, i| m | rules::bit(i));
        let unfiltered = counters
            .iter()
            .enumerate()
            .filter(|(ci, c)| read(ci) && c.filter.is_none());
        for (_, c) in unfiltered {
            for (name, _) in own_fields(c).filter(|(n, _)| !config.derive.contains_key(*n)) {
                optional &= !rules::bit(slot(name));
            }
        }
        if let Some(t) = d.time_field {
            optional &= !rules::bit(t);
        }
        let rules = rules::Rules {
            derived: derived
                .into_iter()
                .map(|(name, program)| rules::Derived {
                    slot: slot(&name),
                    bound: rules::Bound::new(program, slot),
                })
                .collect(),
            counters: counters
                .iter()
                .zip(filters)
                .enumerate()
                .map(|(ci, (c, filter))| rules::CounterRule {
                    filter: filter.map(|p| rules::Bound::new(p, slot)),
                    needs: match read(&ci) {
                        true => own_fields(c).fold(0, |m, (n, _)| m | rules::bit(slot(n))),
                        false => 0,
                    },
                })
                .collect(),
            optional,
            unread,
        };
        decoder.rules = rules;
        decoder
    }
}

/// A counter's own fields and their roles: dimensions, the member, the value.
fn own_fields(c: &CounterSpec) -> impl Iterator<Item = (&str, FieldRole)> {
    let member = match &c.kind {
        Kind::Distinct { member, .. } | Kind::Leaderboard { member } => Some(member.as_str()),
        _ => None,
    };
    c.dimensions
        .iter()
        .map(|d| (d.as_str(), FieldRole::Dimension))
        .chain(member.map(|m| (m, FieldRole::Dimension)))
        .chain(c.value_field.as_deref().map(|v| (v, FieldRole::Value)))
}
