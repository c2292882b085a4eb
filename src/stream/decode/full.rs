//! The decoder's full path: serde_json walks the payload with the same tree of wanted fields as
//! the fast scan ([`Node`]), borrowing strings where it can. Its answers are the reference.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::paths::{Entry, Node};
use super::FieldValue;

/// The payload's top-level object (anything else is an error).
pub(super) struct ObjectSeed<'d, 'a> {
    pub(super) node: &'d Node,
    pub(super) out: &'d mut [Option<FieldValue<'a>>],
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(Walk {
            node: Some(self.node),
            out: self.out,
        })
        .map(drop)
    }
}

/// One wanted value: its fields stored, the value itself answered (containers as `Other`).
struct EntrySeed<'d, 'a> {
    entry: &'d Entry,
    out: &'d mut [Option<FieldValue<'a>>],
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let value = d.deserialize_any(Walk {
            node: self.entry.inner.as_ref(),
            out: &mut *self.out,
        })?;
        for &slot in &self.entry.slots {
            self.out[slot] = Some(value.clone());
        }
        Ok(())
    }
}

/// Visits a value: scalars become a `FieldValue`; objects and arrays are walked for the
/// wanted fields of `node` (all skipped without one).
struct Walk<'d, 'a> {
    node: Option<&'d Node>,
    out: &'d mut [Option<FieldValue<'a>>],
}

impl<'de> Visitor<'de> for Walk<'_, 'de> {
    type Value = FieldValue<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(FieldValue::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(FieldValue::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(FieldValue::Str(Cow::Owned(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(FieldValue::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(i64::try_from(v).map_or(FieldValue::Float(v as f64), FieldValue::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(FieldValue::Float(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(FieldValue::Bool(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(FieldValue::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        match self.node {
            None => while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {},
            Some(node) => {
                while let Some(entry) = map.next_key_seed(KeySeed { node })? {
                    match entry {
                        Some(entry) => map.next_value_seed(EntrySeed {
                            entry,
                            out: &mut *self.out,
                        })?,
                        None => map.next_value::<IgnoredAny>().map(drop)?,
                    }
                }
            }
        }
        Ok(FieldValue::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let Some(node) = self.node else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(FieldValue::Other);
        };
        for index in 0.. {
            let more = match node.by_index(index) {
                Some(entry) => seq
                    .next_element_seed(EntrySeed {
                        entry,
                        out: &mut *self.out,
                    })?
                    .is_some(),
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                break;
            }
        }
        Ok(FieldValue::Other)
    }
}

/// Matches an object key against the node's wanted keys without allocating.
struct KeySeed<'d> {
    node: &'d Node,
}

impl<'de, 'd> DeserializeSeed<'de> for KeySeed<'d> {
    type Value = Option<&'d Entry>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, 'd> Visitor<'de> for KeySeed<'d> {
    type Value = Option<&'d Entry>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.node.by_key(v))
    }
}
