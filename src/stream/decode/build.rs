//! The decoder a model needs: its counters' fields, and the rules of their filters and
//! derived fields. Built from what the model compiled (the topic's [`CompiledDecode`], the
//! counters' filter programs): nothing is compiled or read here, so building cannot fail.

use crate::config::{CompiledDecode, Model, Program, Topic};
use crate::model::{CounterSpec, Kind};

use super::{rules, Decoder, FieldRole};

/// The fields a decoder reads, with their roles, in slot order.
type Fields = Vec<(String, FieldRole)>;

impl Decoder {
    /// The decoder for `counters` (every one reading its events), whose filters are `filters`
    /// (by counter): every field they group by, rank or sum, once each, in counter order
    /// (dimensions, then the member, then the value field), then the fields their filters and
    /// derived fields read. With filters or derived fields, [`rules::Rules`] decide per counter
    /// (see there).
    pub fn for_counters(
        decode: &CompiledDecode,
        filters: &[Option<Program>],
        counters: &[CounterSpec],
    ) -> Decoder {
        Decoder::reading(decode, filters, counters, &vec![true; counters.len()])
    }

    /// The decoder of `topic`'s events: [`Decoder::for_counters`] of the model's counters that
    /// read it. The others skip every event (`Skips::unread`); their fields are not read at
    /// all, so an event of this topic need not carry them.
    pub fn for_topic(model: &Model, topic: &Topic) -> Decoder {
        Decoder::reading(&topic.decode, &model.filters, &model.counters, &topic.reads)
    }

    /// Whether counter `ci` (model order) takes this decoder's events at all.
    pub fn reads(&self, ci: usize) -> bool {
        self.rules.unread & rules::counter_bit(ci) == 0
    }

    /// The decoder of the counters `reads` marks (by counter, in model order).
    fn reading(
        decode: &CompiledDecode,
        filters: &[Option<Program>],
        counters: &[CounterSpec],
        reads: &[bool],
    ) -> Decoder {
        let read = |ci: usize| reads.get(ci).copied().unwrap_or(true);
        let unread = (0..counters.len())
            .filter(|&ci| !read(ci))
            .fold(0, |m, ci| m | rules::counter_bit(ci));
        let mut fields = Fields::new();
        for (_, c) in counters.iter().enumerate().filter(|(ci, _)| read(*ci)) {
            for (name, role) in own_fields(c) {
                add(&mut fields, name, role);
            }
        }
        let filters: Vec<Option<Program>> = (0..counters.len())
            .map(|ci| filters.get(ci).cloned().flatten().filter(|_| read(ci)))
            .collect();
        for v in filters.iter().flatten().flat_map(|p| p.vars()) {
            add(&mut fields, v, FieldRole::Filter);
        }
        let derived: Vec<(String, Program)> = decode
            .derived
            .iter()
            .filter(|(name, _)| fields.iter().any(|(n, _)| n == *name))
            .map(|(name, program)| (name.clone(), program.clone()))
            .collect();
        for v in derived.iter().flat_map(|(_, p)| p.vars()) {
            add(&mut fields, v, FieldRole::Filter);
        }
        let mut decoder = Decoder::new(decode, &fields);
        if filters.iter().any(Option::is_some) || !derived.is_empty() || unread != 0 {
            let optional = optional_slots(&decoder, decode, counters, &filters, read);
            decoder.rules = bind(&decoder, counters, filters, derived, read, optional, unread);
        }
        decoder
    }
}

/// Add `name` to `fields` unless it is there already.
fn add(fields: &mut Fields, name: &str, role: FieldRole) {
    if !fields.iter().any(|(n, _)| n == name) {
        fields.push((name.to_string(), role));
    }
}

/// The slots an event may lack (a bit per slot). Fields of counters that do not filter stay
/// required (the event time too); derived fields never are: a counter whose derived field
/// fails skips the event.
fn optional_slots(
    d: &Decoder,
    decode: &CompiledDecode,
    counters: &[CounterSpec],
    filters: &[Option<Program>],
    read: impl Fn(usize) -> bool,
) -> u64 {
    let mut optional = (0..d.names.len()).fold(0, |m, i| m | rules::bit(i));
    let unfiltered = counters
        .iter()
        .enumerate()
        .filter(|&(ci, _)| read(ci) && filters[ci].is_none());
    for (_, c) in unfiltered {
        for (name, _) in own_fields(c).filter(|(n, _)| !decode.derived.contains_key(*n)) {
            optional &= !rules::bit(slot(d, name));
        }
    }
    if let Some(t) = d.time_field {
        optional &= !rules::bit(t);
    }
    optional
}

/// The rules of `d`: its derived fields and the counters' filters bound to its slots, and the
/// slots each counter needs.
fn bind(
    d: &Decoder,
    counters: &[CounterSpec],
    filters: Vec<Option<Program>>,
    derived: Vec<(String, Program)>,
    read: impl Fn(usize) -> bool,
    optional: u64,
    unread: u64,
) -> rules::Rules {
    let slot_of = |name: &str| slot(d, name);
    rules::Rules {
        derived: derived
            .into_iter()
            .map(|(name, program)| rules::Derived {
                slot: slot(d, &name),
                bound: rules::Bound::new(program, slot_of),
            })
            .collect(),
        counters: counters
            .iter()
            .zip(filters)
            .enumerate()
            .map(|(ci, (c, filter))| rules::CounterRule {
                filter: filter.map(|p| rules::Bound::new(p, slot_of)),
                needs: match read(ci) {
                    true => own_fields(c).fold(0, |m, (n, _)| m | rules::bit(slot(d, n))),
                    false => 0,
                },
            })
            .collect(),
        optional,
        unread,
    }
}

/// The slot of `name`, which the decoder reads (every field of its rules was added to it).
fn slot(d: &Decoder, name: &str) -> usize {
    d.names
        .iter()
        .position(|n| &**n == name)
        .unwrap_or_else(|| unreachable!("`{name}` was added to the decoder's fields"))
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
