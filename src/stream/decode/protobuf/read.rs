//! Reads one Protobuf message with a [`ProtoPlan`]: wanted fields into their slots (strings borrowed
//! from the message), every other field skipped by its wire type without building it. Malformed
//! input (a truncated varint or length, field number 0, an end-group without its start, a
//! wanted field written with another wire type, invalid UTF-8 in a wanted string) is `None`.
//!
//! The work is linear in the message's bytes (every field and packed value takes at least one
//! byte); recursion follows only the plan's wanted paths, and groups are skipped in a loop. A
//! budget of fields per byte of the message ([`ITEMS_PER_BYTE`], as the Avro reader's) and of
//! group nesting bounds it further: past either the reader stops and says so
//! ([`ProtoReader::over_budget`]).

use std::borrow::Cow;

use smallvec::SmallVec;

use super::super::FieldValue;
use super::plan::{Field, Kind, ProtoPlan, I32, I64, LEN, VARINT};

/// Fields (and packed values) a message may hold in all, per byte of it and at least (each
/// takes a byte, so only a reader bug could reach it: a backstop).
const ITEMS_PER_BYTE: u64 = 8;
const ITEMS_BASE: u64 = 1024;

/// Groups nested deeper than this are refused.
const MAX_GROUP_DEPTH: u32 = 64;

const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;

pub(super) struct ProtoReader {
    /// Fields and packed values left for the whole message.
    items: u64,
    /// The budget ran out, or groups nested deeper than [`MAX_GROUP_DEPTH`]: the message is
    /// refused as too complex, not as malformed.
    pub(super) over_budget: bool,
}

impl ProtoReader {
    /// A reader of a message of `len` bytes.
    pub(super) fn new(len: usize) -> ProtoReader {
        let len = u64::try_from(len).unwrap_or(u64::MAX / ITEMS_PER_BYTE);
        ProtoReader {
            items: len
                .saturating_mul(ITEMS_PER_BYTE)
                .saturating_add(ITEMS_BASE),
            over_budget: false,
        }
    }

    /// One more field or packed value, if the budget allows.
    fn spend(&mut self) -> Option<()> {
        match self.items.checked_sub(1) {
            Some(left) => self.items = left,
            None => self.over_budget = true,
        }
        (!self.over_budget).then_some(())
    }

    /// Reads the message `bytes` of `plan` into `out`.
    pub(super) fn message<'a>(
        &mut self,
        mut bytes: &'a [u8],
        plan: &ProtoPlan,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Option<()> {
        for (slot, value) in &plan.defaults {
            if out[*slot].is_none() {
                out[*slot] = Some(value.clone());
            }
        }
        // Occurrences so far of each wanted repeated field (its next item's index).
        let mut seen: SmallVec<[usize; 8]> = SmallVec::new();
        seen.resize(plan.fields.len(), 0);
        while !bytes.is_empty() {
            self.spend()?;
            let key = varint(&mut bytes)?;
            let (number, wire) = (u32::try_from(key >> 3).ok()?, (key & 7) as u8);
            if number == 0 {
                return None;
            }
            let Some(at) = plan.fields.iter().position(|f| f.number == number) else {
                self.skip(&mut bytes, number, wire)?;
                continue;
            };
            let field = &plan.fields[at];
            if field.repeated && wire == LEN && field.kind.wire_type() != LEN {
                // Packed: the values one after another.
                let mut packed = len_delimited(&mut bytes)?;
                while !packed.is_empty() {
                    self.spend()?;
                    let v = scalar(&mut packed, &field.kind)?;
                    self.item(field, &mut seen[at], v, None, out)?;
                }
                continue;
            }
            if wire != field.kind.wire_type() {
                return None;
            }
            let (value, body) = match field.kind {
                Kind::Message => (FieldValue::Other, Some(len_delimited(&mut bytes)?)),
                _ => (scalar(&mut bytes, &field.kind)?, None),
            };
            match field.repeated {
                true => self.item(field, &mut seen[at], value, body, out)?,
                false => {
                    if let (Some(inner), Some(body)) = (&field.inner, body) {
                        self.message(body, inner, out)?;
                    }
                    fill(&field.slots, value, out);
                }
            }
        }
        Some(())
    }

    /// The next item of the repeated `field` (its index `*seen`).
    fn item<'a>(
        &mut self,
        field: &Field,
        seen: &mut usize,
        value: FieldValue<'a>,
        body: Option<&'a [u8]>,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Option<()> {
        let index = *seen;
        *seen += 1;
        fill(&field.slots, FieldValue::Other, out);
        let Some(item) = field.items.iter().find(|i| i.index == index) else {
            return Some(());
        };
        if let (Some(inner), Some(body)) = (&item.inner, body) {
            self.message(body, inner, out)?;
        }
        fill(&item.slots, value, out);
        Some(())
    }
}

fn fill<'a>(slots: &[usize], value: FieldValue<'a>, out: &mut [Option<FieldValue<'a>>]) {
    if let Some((last, rest)) = slots.split_last() {
        for &slot in rest {
            out[slot] = Some(value.clone());
        }
        out[*last] = Some(value);
    }
}

/// One scalar of `kind` (not a message).
fn scalar<'a>(bytes: &mut &'a [u8], kind: &Kind) -> Option<FieldValue<'a>> {
    let unsigned = |n: u64| match i64::try_from(n) {
        Ok(n) => FieldValue::Int(n),
        Err(_) => FieldValue::Float(n as f64),
    };
    Some(match kind {
        Kind::Int32 => FieldValue::Int(i64::from(varint(bytes)? as i32)),
        Kind::Int64 => FieldValue::Int(varint(bytes)? as i64),
        Kind::UInt32 => FieldValue::Int(i64::from(varint(bytes)? as u32)),
        Kind::UInt64 => unsigned(varint(bytes)?),
        Kind::SInt32 => {
            let n = varint(bytes)? as u32;
            FieldValue::Int(i64::from((n >> 1) as i32 ^ -((n & 1) as i32)))
        }
        Kind::SInt64 => {
            let n = varint(bytes)?;
            FieldValue::Int((n >> 1) as i64 ^ -((n & 1) as i64))
        }
        Kind::Bool => FieldValue::Bool(varint(bytes)? != 0),
        Kind::Enum(values) => {
            let n = varint(bytes)? as i32;
            match values.iter().find(|(v, _)| *v == n) {
                Some((_, name)) => FieldValue::Str(Cow::Owned(name.to_string())),
                None => FieldValue::Int(n.into()),
            }
        }
        Kind::Fixed32 => FieldValue::Int(u32::from_le_bytes(fixed(bytes)?).into()),
        Kind::SFixed32 => FieldValue::Int(i32::from_le_bytes(fixed(bytes)?).into()),
        Kind::Float => FieldValue::Float(f32::from_le_bytes(fixed(bytes)?).into()),
        Kind::Fixed64 => unsigned(u64::from_le_bytes(fixed(bytes)?)),
        Kind::SFixed64 => FieldValue::Int(i64::from_le_bytes(fixed(bytes)?)),
        Kind::Double => FieldValue::Float(f64::from_le_bytes(fixed(bytes)?)),
        Kind::Str => FieldValue::Str(Cow::Borrowed(
            std::str::from_utf8(len_delimited(bytes)?).ok()?,
        )),
        Kind::Bytes | Kind::Message => {
            len_delimited(bytes)?;
            FieldValue::Other
        }
    })
}

impl ProtoReader {
    /// Past one field of wire type `wire` (its key read): a group up to its matching end.
    fn skip(&mut self, bytes: &mut &[u8], number: u32, wire: u8) -> Option<()> {
        match wire {
            VARINT => drop(varint(bytes)?),
            I64 => drop(fixed::<8>(bytes)?),
            I32 => drop(fixed::<4>(bytes)?),
            LEN => drop(len_delimited(bytes)?),
            START_GROUP => {
                // The groups open, innermost last: each must end with its own number.
                let mut open: SmallVec<[u32; 4]> = SmallVec::new();
                open.push(number);
                while let Some(&inner) = open.last() {
                    self.spend()?;
                    let key = varint(bytes)?;
                    let (n, w) = (u32::try_from(key >> 3).ok()?, (key & 7) as u8);
                    match w {
                        START_GROUP if open.len() >= MAX_GROUP_DEPTH as usize => {
                            self.over_budget = true;
                            return None;
                        }
                        START_GROUP => open.push(n),
                        END_GROUP if n == inner => drop(open.pop()),
                        END_GROUP => return None,
                        _ => self.skip(bytes, n, w)?,
                    }
                }
            }
            _ => return None,
        }
        Some(())
    }
}

/// A base-128 varint (at most 10 bytes).
#[inline]
pub(super) fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

fn fixed<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    *bytes = rest;
    Some(*head)
}

fn len_delimited<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = usize::try_from(varint(bytes)?).ok()?;
    let (head, rest) = (bytes.get(..n)?, bytes.get(n..)?);
    *bytes = rest;
    Some(head)
}
