//! Reads one Avro binary datum with a [`AvroPlan`]: wanted values into their slots (strings borrowed
//! from the message), everything else skipped without building it. Any malformed input (a
//! length past the end, a bad union branch, invalid UTF-8 in a wanted string, bytes left over)
//! is `None`.
//!
//! The work is bounded by the datum's size: every value but the zero-width ones takes a byte,
//! an array can hold no more items than bytes remain unless its items take none, and the items
//! of all arrays and maps together are budgeted at [`ITEMS_PER_BYTE`] per byte (plus
//! [`ITEMS_BASE`]). Past the budget the reader stops and says so ([`AvroReader::over_budget`]).

use std::borrow::Cow;

use super::super::FieldValue;
use super::plan::{AvroKind, AvroPlan};

/// Array and map items a datum may hold in all, per byte of it and at least (8 M for a message
/// of the default `max_message_bytes`). Only zero-width items (nulls, empty records) can come
/// near it: any other item takes a byte.
const ITEMS_PER_BYTE: i64 = 8;
const ITEMS_BASE: i64 = 1024;

pub(super) struct AvroReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Array and map items left for the whole datum: items of a zero-width type (null, an
    /// empty record) take no bytes, so their count alone bounds the work.
    items: i64,
    /// The item budget ran out (the datum is refused as too complex, not as malformed).
    pub(super) over_budget: bool,
}

impl<'a> AvroReader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> AvroReader<'a> {
        let len = i64::try_from(bytes.len()).unwrap_or(i64::MAX / ITEMS_PER_BYTE);
        AvroReader {
            bytes,
            pos: 0,
            items: len
                .saturating_mul(ITEMS_PER_BYTE)
                .saturating_add(ITEMS_BASE),
            over_budget: false,
        }
    }

    pub(super) fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    /// A zigzag varint (int and long alike; at most 10 bytes).
    fn long(&mut self) -> Option<i64> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = *self.bytes.get(self.pos)?;
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        None
    }

    fn len(&mut self) -> Option<usize> {
        usize::try_from(self.long()?).ok()
    }

    /// One value of `plan`: its slots filled, and what it is.
    pub(super) fn value(
        &mut self,
        plan: &AvroPlan,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Option<FieldValue<'a>> {
        if !plan.wanted {
            self.skip(plan)?;
            return Some(FieldValue::Other);
        }
        self.read(plan, out)
    }

    /// One value of `plan`, read (not skipped) even if nothing in it is wanted: a union that
    /// fills slots takes the value of its branch.
    fn read(
        &mut self,
        plan: &AvroPlan,
        out: &mut [Option<FieldValue<'a>>],
    ) -> Option<FieldValue<'a>> {
        let v = match &plan.kind {
            AvroKind::Null => FieldValue::Other,
            AvroKind::Bool => FieldValue::Bool(match self.take(1)?[0] {
                0 => false,
                1 => true,
                _ => return None,
            }),
            AvroKind::Long { divide } => FieldValue::Int(self.long()?.div_euclid(*divide)),
            AvroKind::Float => {
                FieldValue::Float(f32::from_le_bytes(self.take(4)?.try_into().ok()?).into())
            }
            AvroKind::Double => {
                FieldValue::Float(f64::from_le_bytes(self.take(8)?.try_into().ok()?))
            }
            AvroKind::Str => {
                let n = self.len()?;
                FieldValue::Str(Cow::Borrowed(std::str::from_utf8(self.take(n)?).ok()?))
            }
            AvroKind::Enum(symbols) => {
                let i = usize::try_from(self.long()?).ok()?;
                FieldValue::Str(Cow::Owned(symbols.get(i)?.to_string()))
            }
            AvroKind::Record(fields) => {
                for f in fields {
                    self.value(f, out)?;
                }
                FieldValue::Other
            }
            AvroKind::Array(item, wanted) => {
                let mut index = 0;
                self.blocks(item.zero_width, |r| {
                    let plan = wanted
                        .iter()
                        .find(|(i, _)| *i == index)
                        .map_or(&**item, |(_, p)| p);
                    index += 1;
                    r.value(plan, out).map(drop)
                })?;
                FieldValue::Other
            }
            AvroKind::Map(value, wanted) => {
                self.blocks(false, |r| {
                    let n = r.len()?;
                    let key = r.take(n)?;
                    let plan = wanted
                        .iter()
                        .find(|(k, _)| k.as_bytes() == key)
                        .map_or(&**value, |(_, p)| p);
                    r.value(plan, out).map(drop)
                })?;
                FieldValue::Other
            }
            AvroKind::Union(branches) => {
                let branch = branches.get(usize::try_from(self.long()?).ok()?)?;
                match plan.slots.is_empty() {
                    true => self.value(branch, out)?,
                    false => self.read(branch, out)?,
                }
            }
            AvroKind::Bytes | AvroKind::Fixed(_) => {
                self.skip(plan)?;
                FieldValue::Other
            }
        };
        for &slot in &plan.slots {
            out[slot] = Some(v.clone());
        }
        Some(v)
    }

    /// Past one value of `plan`, building nothing.
    fn skip(&mut self, plan: &AvroPlan) -> Option<()> {
        match &plan.kind {
            AvroKind::Null => {}
            AvroKind::Bool => {
                self.take(1)?;
            }
            AvroKind::Long { .. } | AvroKind::Enum(_) => {
                self.long()?;
            }
            AvroKind::Float => {
                self.take(4)?;
            }
            AvroKind::Double => {
                self.take(8)?;
            }
            AvroKind::Bytes | AvroKind::Str => {
                let n = self.len()?;
                self.take(n)?;
            }
            AvroKind::Fixed(n) => {
                self.take(*n)?;
            }
            AvroKind::Record(fields) => {
                for f in fields {
                    self.skip(f)?;
                }
            }
            AvroKind::Array(item, _) => self.blocks(item.zero_width, |r| r.skip(item))?,
            AvroKind::Map(value, _) => self.blocks(false, |r| {
                let n = r.len()?;
                r.take(n)?;
                r.skip(value)
            })?,
            AvroKind::Union(branches) => {
                let branch = branches.get(usize::try_from(self.long()?).ok()?)?;
                self.skip(branch)?;
            }
        }
        Some(())
    }

    /// The items of an array or map: blocks of `count` items (a negative count is followed by
    /// the block's size in bytes), ended by a zero count. Items that are not `zero_width` take
    /// a byte each: a count past the bytes left is malformed, refused before it loops.
    fn blocks(
        &mut self,
        zero_width: bool,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        loop {
            let mut count = self.long()?;
            if count == 0 {
                return Some(());
            }
            if count < 0 {
                count = count.checked_neg()?;
                self.long()?;
            }
            let left = self.bytes.len() - self.pos;
            if !zero_width && usize::try_from(count).ok()? > left {
                return None;
            }
            self.items -= count;
            if self.items < 0 {
                self.over_budget = true;
                return None;
            }
            for _ in 0..count {
                item(self)?;
            }
        }
    }
}
