//! A message type compiled for the fields the decoder wants: the wanted field numbers, how to
//! read each, and the decoder slots they fill. Everything else is skipped by its wire type, so a
//! plan holds only what is wanted (a recursive message type is fine: only wanted paths are
//! followed). Built once per (schema id, message).

use std::borrow::Cow;

use prost_reflect::{FieldDescriptor, Kind as Type, MessageDescriptor};
use smallvec::SmallVec;

use super::super::paths::{Entry, Node};
use super::super::FieldValue;

/// Deeper wanted paths are refused (the field paths are short; this bounds the reader's
/// recursion whatever the schema).
pub(super) const MAX_DEPTH: usize = 32;

/// What is wanted of one message.
#[derive(Debug, Default)]
pub(super) struct ProtoPlan {
    /// The wanted fields, in the order they were asked for (few: a linear search is fastest).
    pub(super) fields: Vec<Field>,
    /// Slots of wanted scalar fields without presence (proto3 `implicit`): a message that lacks
    /// one reads its default (0, "", false, the enum's first value), as protobuf defines.
    pub(super) defaults: Vec<(usize, FieldValue<'static>)>,
}

/// One wanted field.
#[derive(Debug)]
pub(super) struct Field {
    pub(super) number: u32,
    pub(super) kind: Kind,
    /// A `repeated` field: each occurrence (or packed value) is the next item.
    pub(super) repeated: bool,
    /// The slots the field's value fills (for a message or a repeated field: a non-scalar).
    pub(super) slots: SmallVec<[usize; 1]>,
    /// A message field: what is wanted inside it.
    pub(super) inner: Option<Box<ProtoPlan>>,
    /// A repeated field: the wanted items, by index.
    pub(super) items: Vec<Item>,
}

/// One wanted item of a repeated field.
#[derive(Debug)]
pub(super) struct Item {
    pub(super) index: usize,
    pub(super) slots: SmallVec<[usize; 1]>,
    pub(super) inner: Option<Box<ProtoPlan>>,
}

/// How a field's values are written and what they read as.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Kind {
    /// Varints: int32 (sign-extended), int64, uint32, uint64.
    Int32,
    Int64,
    UInt32,
    UInt64,
    /// Zigzag varints.
    SInt32,
    SInt64,
    Bool,
    /// An enum's number; read as its name (a number the schema does not name: the number).
    Enum(Vec<(i32, Box<str>)>),
    /// Little-endian 4 and 8 bytes.
    Fixed32,
    SFixed32,
    Float,
    Fixed64,
    SFixed64,
    Double,
    /// Length-delimited.
    Str,
    Bytes,
    Message,
}

/// The wire type a kind is written with (a repeated scalar may also come packed, as bytes).
pub(super) const VARINT: u8 = 0;
pub(super) const I64: u8 = 1;
pub(super) const LEN: u8 = 2;
pub(super) const I32: u8 = 5;

impl Kind {
    pub(super) fn wire_type(&self) -> u8 {
        match self {
            Kind::Int32
            | Kind::Int64
            | Kind::UInt32
            | Kind::UInt64
            | Kind::SInt32
            | Kind::SInt64
            | Kind::Bool
            | Kind::Enum(_) => VARINT,
            Kind::Fixed32 | Kind::SFixed32 | Kind::Float => I32,
            Kind::Fixed64 | Kind::SFixed64 | Kind::Double => I64,
            Kind::Str | Kind::Bytes | Kind::Message => LEN,
        }
    }
}

/// The plan of `message` for the fields of `root`.
pub(super) fn compile(message: &MessageDescriptor, root: &Node) -> Result<ProtoPlan, TooDeep> {
    plan(message, Some(root), 0)
}

/// Field paths deeper than [`MAX_DEPTH`]: the schema is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("field paths deeper than {MAX_DEPTH}")]
pub(super) struct TooDeep;

fn plan(
    message: &MessageDescriptor,
    node: Option<&Node>,
    depth: usize,
) -> Result<ProtoPlan, TooDeep> {
    if depth > MAX_DEPTH {
        return Err(TooDeep);
    }
    let mut out = ProtoPlan::default();
    let Some(node) = node else {
        return Ok(out);
    };
    for (name, entry) in node.keys() {
        // A field the message lacks stays absent (`missing_field`): another version may have it.
        // Groups (proto2) are skipped as unknown fields: a path into one finds nothing.
        let Some(field) = message.get_field_by_name(name).filter(|f| !f.is_group()) else {
            continue;
        };
        let f = self::field(&field, entry, depth)?;
        if !field.is_list() && !field.supports_presence() && f.kind != Kind::Message {
            for &slot in &f.slots {
                out.defaults.push((slot, default(&f.kind)));
            }
        }
        out.fields.push(f);
    }
    Ok(out)
}

fn field(field: &FieldDescriptor, entry: &Entry, depth: usize) -> Result<Field, TooDeep> {
    let kind = match field.kind() {
        Type::Int32 => Kind::Int32,
        Type::Int64 => Kind::Int64,
        Type::Uint32 => Kind::UInt32,
        Type::Uint64 => Kind::UInt64,
        Type::Sint32 => Kind::SInt32,
        Type::Sint64 => Kind::SInt64,
        Type::Bool => Kind::Bool,
        Type::Enum(e) => Kind::Enum(e.values().map(|v| (v.number(), v.name().into())).collect()),
        Type::Fixed32 => Kind::Fixed32,
        Type::Sfixed32 => Kind::SFixed32,
        Type::Float => Kind::Float,
        Type::Fixed64 => Kind::Fixed64,
        Type::Sfixed64 => Kind::SFixed64,
        Type::Double => Kind::Double,
        Type::String => Kind::Str,
        Type::Bytes => Kind::Bytes,
        Type::Message(_) => Kind::Message,
    };
    let sub = |node: Option<&Node>| match field.kind() {
        Type::Message(m) if kind == Kind::Message => {
            plan(&m, node, depth + 1).map(Box::new).map(Some)
        }
        _ => Ok(None),
    };
    let repeated = field.is_list() || field.is_map();
    let (inner, items) = match repeated {
        true => {
            let mut items = Vec::new();
            if let Some(n) = &entry.inner {
                for (index, e) in n.indexes() {
                    items.push(Item {
                        index,
                        slots: e.slots.clone(),
                        inner: sub(e.inner.as_ref())?,
                    });
                }
            }
            (None, items)
        }
        false => (sub(entry.inner.as_ref())?, Vec::new()),
    };
    Ok(Field {
        number: field.number(),
        kind,
        repeated,
        slots: entry.slots.clone(),
        inner,
        items,
    })
}

/// What an absent field without presence reads as.
fn default(kind: &Kind) -> FieldValue<'static> {
    match kind {
        Kind::Bool => FieldValue::Bool(false),
        Kind::Float | Kind::Double => FieldValue::Float(0.0),
        Kind::Str => FieldValue::Str(Cow::Borrowed("")),
        Kind::Bytes | Kind::Message => FieldValue::Other,
        // proto3 enums start at 0, their default; a proto2 enum field has presence.
        Kind::Enum(values) => values
            .iter()
            .find(|(n, _)| *n == 0)
            .map_or(FieldValue::Int(0), |(_, name)| {
                FieldValue::Str(Cow::Owned(name.to_string()))
            }),
        _ => FieldValue::Int(0),
    }
}
