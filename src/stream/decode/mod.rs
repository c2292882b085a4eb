//! Decode: a Kafka payload (JSON, Avro or Protobuf) into the few fields the counters need.
//!
//! Only the wanted fields are extracted; everything else is skipped without allocating. JSON
//! string values borrow from the message buffer unless they contain escapes: a borrowed scan
//! (`scan.rs`) handles the common shape, and anything else (escapes, floats in wanted fields,
//! invalid JSON) goes to serde_json (`full.rs`), which gives the reference answer. Avro and
//! Protobuf payloads are read with a plan of their schema (`avro/`, `protobuf/`, `schema/`).
//!
//! A decoder is built from what the model compiled (`build.rs`: the topic's
//! [`CompiledDecode`](crate::config::CompiledDecode), the counters' filter programs), in memory:
//! building one compiles no expression and reads no file.

use std::borrow::Cow;

use rdkafka::message::{BorrowedHeaders, Headers};
use serde::de::DeserializeSeed;
use smallvec::SmallVec;

use crate::config::{CompiledDecode, FieldSource, Format, TimeFormat};

/// A scalar JSON value, borrowed from the payload where possible.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// A string (borrowed unless it had escapes).
    Str(Cow<'a, str>),
    /// An integer that fits i64.
    Int(i64),
    /// Any other number.
    Float(f64),
    /// true / false.
    Bool(bool),
    /// null, an array or an object.
    Other,
}

/// What one field is used for; decides which JSON types are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRole {
    /// Part of a key: strings, integers and booleans are accepted.
    Dimension,
    /// An integer summed by a counter.
    Value,
    /// The event time.
    Time,
    /// Read only by filters or derived fields: any value (or none) is taken as it is.
    Filter,
}

/// One decoded event: field values in the decoder's field order, and the event time.
#[derive(Debug)]
pub struct Event<'a> {
    /// `values[i]` belongs to `Decoder::fields()[i]`; dimensions are strings, values integers.
    pub dims: SmallVec<[Cow<'a, str>; 4]>,
    /// Integer values of `Value` fields, in field order (0 for other fields).
    pub nums: SmallVec<[i64; 4]>,
    /// Event time, Unix epoch milliseconds.
    pub ts_ms: i64,
    /// The counters (a bit each, in model order) that do not take this event, by reason.
    pub skips: Skips,
}

/// What Kafka says of a record besides its payload and time: the sources `$key`,
/// `$header.<name>`, `$topic` and `$partition` read from it.
#[derive(Default, Clone, Copy)]
pub struct Record<'a> {
    /// The record key.
    pub key: Option<&'a [u8]>,
    /// The record headers.
    pub headers: Option<&'a BorrowedHeaders>,
    /// The topic it was read from.
    pub topic: &'a str,
    /// The partition it was read from.
    pub partition: i32,
}

/// Turns payloads into events. Built once from the config; cheap to call per message.
pub struct Decoder {
    /// Field names, by slot (the index in `Event::dims` / `Event::nums`).
    names: Vec<Box<str>>,
    roles: Vec<FieldRole>,
    /// The payload fields, as one tree of paths.
    root: paths::Node,
    /// The fields read from the record's metadata: (slot, source).
    meta: Vec<(usize, FieldSource)>,
    /// Derived fields and counter filters (none: every field is required).
    rules: rules::Rules,
    time_field: Option<usize>,
    time_format: TimeFormat,
    max_message_bytes: usize,
    max_value_bytes: usize,
    /// Avro or Protobuf payloads; none: JSON.
    binary: Option<Box<Binary>>,
    /// `decode.max_future` in ms: later event times are bad input, not keys living for millennia.
    max_future_ms: i64,
}

impl Decoder {
    /// Whether a field reads the record's headers: a consumer that finds none does not ask
    /// librdkafka to parse them.
    pub fn reads_headers(&self) -> bool {
        self.meta
            .iter()
            .any(|(_, s)| matches!(s, FieldSource::Header(_)))
    }

    /// `fields` are the distinct field names the counters need, with their roles; `decode` is
    /// the topic's decoding, compiled with the model.
    pub fn new(decode: &CompiledDecode, fields: &[(String, FieldRole)]) -> Decoder {
        let config = &decode.config;
        let mut names: Vec<Box<str>> = fields.iter().map(|(n, _)| n.as_str().into()).collect();
        let mut roles: Vec<FieldRole> = fields.iter().map(|(_, r)| *r).collect();
        let time_field = config.time_field.as_ref().map(|t| {
            names.push(t.as_str().into());
            roles.push(FieldRole::Time);
            names.len() - 1
        });
        let mut root = paths::Node::default();
        let mut meta = Vec::new();
        for (slot, name) in names.iter().enumerate() {
            if decode.derived.contains_key(&**name) {
                continue;
            }
            // In an expression, a dotted name not listed in [decode.fields] reads that path.
            let source = match roles[slot] {
                FieldRole::Filter if !decode.lists(name) => {
                    FieldSource::parse(name).unwrap_or_else(|_| FieldSource::top_level(name))
                }
                _ => decode.source(name),
            };
            match source {
                FieldSource::Payload(path) => root.insert(&path, slot),
                source => meta.push((slot, source)),
            }
        }
        let binary = match config.format {
            Format::Json => None,
            Format::Avro => Some(Box::new(Binary::Avro(avro::Avro::new(
                &decode.schema,
                &root,
                config.max_schema_nodes,
                config.max_schemas,
            )))),
            Format::Protobuf => Some(Box::new(Binary::Protobuf(protobuf::Protobuf::new(
                &decode.schema,
                &root,
                config.max_schema_nodes,
                config.max_schemas,
            )))),
        };
        Decoder {
            names,
            roles,
            root,
            meta,
            rules: rules::Rules::default(),
            time_field,
            time_format: config.time_format,
            max_message_bytes: config.max_message_bytes,
            max_value_bytes: config.max_value_bytes,
            binary,
            max_future_ms: i64::try_from(config.max_future.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Index of a field by name, as used in `Event::dims` / `Event::nums`.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| &**n == name)
    }

    /// Whether a field is read from inside the payload's top-level field `key`.
    pub fn reads_top_level(&self, key: &str) -> bool {
        self.root.by_key(key).is_some()
    }

    /// Decode one payload and refuse an event time more than `decode.max_future` after `now_ms`.
    pub fn decode_at<'a>(
        &self,
        payload: Option<&'a [u8]>,
        kafka_ts_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Event<'a>, DecodeError> {
        self.decode_record(&Record::default(), payload, kafka_ts_ms, now_ms)
    }

    /// [`Decoder::decode_at`] of a record whose key, headers, topic and partition are known.
    pub fn decode_record<'a>(
        &self,
        record: &Record<'a>,
        payload: Option<&'a [u8]>,
        kafka_ts_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Event<'a>, DecodeError> {
        let event = self.decode_with(record, payload, kafka_ts_ms, true)?;
        if event.ts_ms > now_ms.saturating_add(self.max_future_ms) {
            return Err(DecodeError::FutureTime);
        }
        Ok(event)
    }

    /// Decode one payload. `kafka_ts_ms` is the message timestamp, used when no time field is set.
    pub fn decode<'a>(
        &self,
        payload: Option<&'a [u8]>,
        kafka_ts_ms: Option<i64>,
    ) -> Result<Event<'a>, DecodeError> {
        self.decode_with(&Record::default(), payload, kafka_ts_ms, true)
    }

    /// [`Decoder::decode`] with the full parser only (no fast scan): the reference the fast
    /// path is checked against (tests and the fuzz target compare the two).
    #[doc(hidden)]
    pub fn decode_reference<'a>(
        &self,
        payload: Option<&'a [u8]>,
        kafka_ts_ms: Option<i64>,
    ) -> Result<Event<'a>, DecodeError> {
        self.decode_with(&Record::default(), payload, kafka_ts_ms, false)
    }

    fn decode_with<'a>(
        &self,
        record: &Record<'a>,
        payload: Option<&'a [u8]>,
        kafka_ts_ms: Option<i64>,
        fast: bool,
    ) -> Result<Event<'a>, DecodeError> {
        let payload = payload.ok_or(DecodeError::Empty)?;
        if payload.is_empty() {
            return Err(DecodeError::Empty);
        }
        if payload.len() > self.max_message_bytes {
            return Err(DecodeError::TooLarge);
        }
        let mut raw: SmallVec<[Option<FieldValue<'a>>; 4]> = SmallVec::new();
        raw.resize(self.names.len(), None);
        match self.binary.as_deref() {
            Some(Binary::Avro(avro)) => avro.read(payload, &mut raw)?,
            Some(Binary::Protobuf(proto)) => proto.read(payload, &mut raw)?,
            None => self.json(payload, fast, &mut raw)?,
        }
        for (slot, source) in &self.meta {
            raw[*slot] = self.metadata(record, source, self.roles[*slot])?;
        }

        // Derived fields, then the filters (on the values as read).
        let failed = match self.rules.derived.is_empty() {
            true => 0,
            false => self.rules.derive(&mut raw),
        };
        let mut skips = match self.rules.counters.is_empty() {
            true => Skips::default(),
            false => self.rules.filter(&raw),
        };
        let (mut absent, mut wrong) = (0u64, 0u64);
        let mut dims = SmallVec::new();
        let mut nums = SmallVec::new();
        for (i, value) in raw.into_iter().enumerate() {
            let optional = self.rules.optional & rules::bit(i) != 0;
            let converted = match value {
                _ if self.roles[i] == FieldRole::Filter => Ok((Cow::Borrowed(""), 0)),
                None => Err(DecodeError::MissingField),
                Some(FieldValue::Other) if self.roles[i] != FieldRole::Time => {
                    Err(DecodeError::WrongType)
                }
                Some(v) => self.convert(i, v),
            };
            let (dim, num) = match converted {
                Ok(pair) => pair,
                Err(e) if !optional => return Err(e),
                Err(DecodeError::MissingField) => {
                    absent |= rules::bit(i);
                    (Cow::Borrowed(""), 0)
                }
                Err(_) => {
                    wrong |= rules::bit(i);
                    (Cow::Borrowed(""), 0)
                }
            };
            dims.push(dim);
            nums.push(num);
        }
        if !self.rules.counters.is_empty() {
            self.rules.needs(&mut skips, absent, wrong, failed);
        }
        let ts_ms = match self.time_field {
            Some(i) => nums[i],
            None => kafka_ts_ms
                .filter(|t| (crate::window::MIN_TS_MS..=crate::window::MAX_TS_MS).contains(t))
                .ok_or(DecodeError::BadTimestamp)?,
        };
        Ok(Event {
            dims,
            nums,
            ts_ms,
            skips,
        })
    }

    /// A JSON payload's wanted fields into `raw`: the fast scan, else the full parser.
    fn json<'a>(
        &self,
        payload: &'a [u8],
        fast: bool,
        raw: &mut [Option<FieldValue<'a>>],
    ) -> Result<(), DecodeError> {
        let text = std::str::from_utf8(payload).map_err(|_| DecodeError::NotUtf8)?;
        if !fast || scan::scan(text, &self.root, raw).is_none() {
            // Escapes, floats, long integers, deep nesting or invalid JSON: the full parser.
            raw.fill(None);
            let mut de = serde_json::Deserializer::from_str(text);
            full::ObjectSeed {
                node: &self.root,
                out: raw,
            }
            .deserialize(&mut de)
            .map_err(|_| DecodeError::NotJson)?;
            de.end().map_err(|_| DecodeError::NotJson)?;
        }
        Ok(())
    }

    /// Avro and Protobuf: ask the schema registry off the caller's thread, retrying an outage
    /// until `stop` is cancelled (the lane's shutdown), instead of asking once per event. An
    /// event whose schema is not known within a short wait is [`DecodeError::Unavailable`]:
    /// read it again once [`Decoder::schema_news`] says a fetch settled since.
    pub fn wait_for_schemas(&mut self, stop: tokio_util::sync::CancellationToken) {
        match self.binary.as_deref_mut() {
            Some(Binary::Avro(avro)) => avro.stop_on(stop),
            Some(Binary::Protobuf(proto)) => proto.stop_on(stop),
            None => {}
        }
    }

    /// The schema registry's side of decoding: fetches settled, schemas held and forgotten.
    pub fn schema_news(&self) -> SchemaNews {
        match self.binary.as_deref() {
            Some(Binary::Avro(avro)) => avro.news(),
            Some(Binary::Protobuf(proto)) => proto.news(),
            None => SchemaNews::default(),
        }
    }

    /// One field's value as a dimension (text) or a number (a value, the time).
    fn convert<'a>(
        &self,
        i: usize,
        value: FieldValue<'a>,
    ) -> Result<(Cow<'a, str>, i64), DecodeError> {
        match self.roles[i] {
            FieldRole::Dimension => {
                let s = match value {
                    FieldValue::Str(s) => s,
                    FieldValue::Int(n) => Cow::Owned(n.to_string()),
                    FieldValue::Bool(b) => Cow::Borrowed(if b { "true" } else { "false" }),
                    _ => return Err(DecodeError::WrongType),
                };
                if s.len() > self.max_value_bytes {
                    return Err(DecodeError::TooLarge);
                }
                Ok((s, 0))
            }
            FieldRole::Value => match value {
                FieldValue::Int(n) => Ok((Cow::Borrowed(""), n)),
                _ => Err(DecodeError::WrongType),
            },
            FieldRole::Time => Ok((Cow::Borrowed(""), self.parse_time(&value)?)),
            FieldRole::Filter => Ok((Cow::Borrowed(""), 0)),
        }
    }

    /// A field read from the record's metadata. Text is taken as a number where the field is
    /// one (a value, or an epoch time).
    fn metadata<'a>(
        &self,
        record: &Record<'a>,
        source: &FieldSource,
        role: FieldRole,
    ) -> Result<Option<FieldValue<'a>>, DecodeError> {
        let bytes = match source {
            FieldSource::Topic => return Ok(Some(FieldValue::Str(Cow::Borrowed(record.topic)))),
            FieldSource::Partition => return Ok(Some(FieldValue::Int(record.partition.into()))),
            FieldSource::Key => record.key,
            FieldSource::Header(name) => record.headers.and_then(|h| {
                (0..h.count())
                    .rev()
                    .filter_map(|i| h.try_get(i))
                    .find(|h| h.key == &**name)
                    .and_then(|h| h.value)
            }),
            FieldSource::Payload(_) => None,
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
        let numeric = role == FieldRole::Value
            || role == FieldRole::Time && self.time_format != TimeFormat::Rfc3339;
        Ok(Some(match text.parse::<i64>() {
            Ok(n) if numeric => FieldValue::Int(n),
            _ => FieldValue::Str(Cow::Borrowed(text)),
        }))
    }

    fn parse_time(&self, value: &FieldValue<'_>) -> Result<i64, DecodeError> {
        let ms = match (self.time_format, value) {
            (TimeFormat::EpochMs, FieldValue::Int(n)) => *n,
            (TimeFormat::EpochMs, FieldValue::Float(f)) if f.is_finite() => f.floor() as i64,
            (TimeFormat::EpochS, FieldValue::Int(n)) => {
                n.checked_mul(1000).ok_or(DecodeError::BadTimestamp)?
            }
            (TimeFormat::EpochS, FieldValue::Float(f)) if f.is_finite() => {
                (f * 1000.0).floor() as i64
            }
            (TimeFormat::Rfc3339, FieldValue::Str(s)) => chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|_| DecodeError::BadTimestamp)?
                .timestamp_millis(),
            _ => return Err(DecodeError::BadTimestamp),
        };
        // Years 1..9999 only: windows and key time formats are defined there.
        if !(crate::window::MIN_TS_MS..=crate::window::MAX_TS_MS).contains(&ms) {
            return Err(DecodeError::BadTimestamp);
        }
        Ok(ms)
    }
}

/// The binary formats, read with a schema.
enum Binary {
    Avro(avro::Avro),
    Protobuf(protobuf::Protobuf),
}

mod avro;
mod build;
mod error;
mod full;
mod paths;
mod protobuf;
mod rules;
mod schema;

pub use error::DecodeError;
pub use rules::Skips;
pub use schema::SchemaNews;
mod scan;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fields;
#[cfg(test)]
mod tests_rules;
