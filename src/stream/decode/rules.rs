//! Per-counter rules the decoder applies after reading an event's fields: derived fields
//! (`[decode.derive]`) and counter filters (`counters[].filter`), both CEL compiled with the
//! model ([`Program`]).
//!
//! A counter with a filter takes only the events it accepts. The fields only such counters
//! read are optional: an event without them is not bad input, it is skipped by the counters
//! that needed them, each counted by reason ([`Skips`]). Fields of counters without a filter
//! stay required (an event without one is refused as before).

use std::borrow::Cow;

use crate::config::{Program, Val};

use super::FieldValue;

/// Why the counters of an event skipped it: one bit per counter in each mask.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skips {
    /// The filter said no.
    pub filtered: u64,
    /// A filter or a derived field it needs could not be computed (wrong type, overflow).
    pub failed: u64,
    /// A field it needs is missing.
    pub missing: u64,
    /// A field it needs has a type it cannot use, or is too long.
    pub invalid: u64,
    /// It does not read the event's topic (`counters[].topics`): by design, so not in
    /// [`Skips::masks`] nor in any metric.
    pub unread: u64,
}

impl Skips {
    /// The metric `reason` of each mask, in [`Skips::masks`] order.
    pub const REASONS: [&'static str; 4] = [
        "filtered",
        "expression_error",
        "missing_field",
        "invalid_field",
    ];

    /// Every counter that skips the event.
    #[inline]
    pub fn all(&self) -> u64 {
        self.filtered | self.failed | self.missing | self.invalid | self.unread
    }

    /// The masks of skips counted in metrics, in [`Skips::REASONS`] order.
    pub fn masks(&self) -> [u64; 4] {
        [self.filtered, self.failed, self.missing, self.invalid]
    }
}

/// A program with its fields bound to decoder slots.
pub(super) struct Bound {
    program: Program,
    slots: Vec<usize>,
}

impl Bound {
    pub(super) fn new(program: Program, slot_of: impl FnMut(&str) -> usize) -> Bound {
        let slots = program
            .vars()
            .iter()
            .map(|v| v.as_str())
            .map(slot_of)
            .collect();
        Bound { program, slots }
    }

    /// The value of the program's `i`-th field in `raw`.
    #[inline]
    fn var<'v>(&self, raw: &'v [Option<FieldValue<'_>>], i: usize) -> Val<'v> {
        match &raw[self.slots[i]] {
            Some(FieldValue::Str(s)) => Val::Str(Cow::Borrowed(s)),
            Some(FieldValue::Int(n)) => Val::Int(*n),
            Some(FieldValue::Float(f)) => Val::Double(*f),
            Some(FieldValue::Bool(b)) => Val::Bool(*b),
            Some(FieldValue::Other) | None => Val::Null,
        }
    }
}

/// A derived field: its slot and the program computing it.
pub(super) struct Derived {
    pub(super) slot: usize,
    pub(super) bound: Bound,
}

/// One counter's rule: its filter, and the slots it needs.
pub(super) struct CounterRule {
    pub(super) filter: Option<Bound>,
    /// The counter's own fields (dimensions, member, value), as a slot mask.
    pub(super) needs: u64,
}

/// Every rule of a decoder; empty (and free) when no counter filters and nothing is derived.
#[derive(Default)]
pub(super) struct Rules {
    pub(super) derived: Vec<Derived>,
    pub(super) counters: Vec<CounterRule>,
    /// Slots an event may lack (a bit per slot).
    pub(super) optional: u64,
    /// The counters that do not read the decoder's topic (a bit per counter).
    pub(super) unread: u64,
}

impl Rules {
    /// Computes the derived fields into `raw`; a slot whose program failed is in the answer.
    pub(super) fn derive<'a>(&self, raw: &mut [Option<FieldValue<'a>>]) -> u64 {
        let mut failed = 0;
        for d in &self.derived {
            let b = &d.bound;
            let value = match b.program.eval_with(&|i| b.var(raw, i)) {
                Ok(Val::Str(s)) => Some(FieldValue::Str(Cow::Owned(s.into_owned()))),
                Ok(Val::Int(n)) => Some(FieldValue::Int(n)),
                Ok(Val::UInt(n)) => {
                    Some(i64::try_from(n).map_or(FieldValue::Float(n as f64), FieldValue::Int))
                }
                Ok(Val::Double(f)) => Some(FieldValue::Float(f)),
                Ok(Val::Bool(b)) => Some(FieldValue::Bool(b)),
                Ok(Val::Null) => None,
                Err(_) => {
                    failed |= bit(d.slot);
                    None
                }
            };
            raw[d.slot] = value;
        }
        failed
    }

    /// The counters whose filter refuses the event (or fails on it).
    pub(super) fn filter(&self, raw: &[Option<FieldValue<'_>>]) -> Skips {
        let mut s = Skips {
            unread: self.unread,
            ..Skips::default()
        };
        for (ci, rule) in self.counters.iter().enumerate() {
            if let Some(f) = &rule.filter {
                match f.program.test_with(&|i| f.var(raw, i)) {
                    Ok(true) => {}
                    Ok(false) => s.filtered |= 1 << ci,
                    Err(_) => s.failed |= 1 << ci,
                }
            }
        }
        s
    }

    /// Adds the counters the filters let through that need a slot that is `absent`, `wrong`
    /// or `failed` (a derived field that could not be computed).
    pub(super) fn needs(&self, s: &mut Skips, absent: u64, wrong: u64, failed: u64) {
        if absent | wrong | failed == 0 {
            return;
        }
        let taken = !(s.filtered | s.failed | s.unread);
        for (ci, rule) in self.counters.iter().enumerate() {
            let me = 1u64 << ci;
            if taken & me == 0 {
                continue;
            }
            if rule.needs & failed != 0 {
                s.failed |= me;
            } else if rule.needs & absent != 0 {
                s.missing |= me;
            } else if rule.needs & wrong != 0 {
                s.invalid |= me;
            }
        }
    }
}

/// The mask bit of a slot (slots past 63 are never optional, so never flagged).
#[inline]
pub(super) fn bit(slot: usize) -> u64 {
    if slot < 64 {
        1 << slot
    } else {
        0
    }
}

/// The mask bit of counter `ci` (counters past 63 are never flagged: validation allows at most
/// 64 counters when any rule or topic restriction applies).
#[inline]
pub(super) fn counter_bit(ci: usize) -> u64 {
    bit(ci)
}
