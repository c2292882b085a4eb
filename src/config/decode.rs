//! `[decode]`: how a message becomes an event, as written ([`DecodeConfig`]) and compiled once
//! ([`DecodeConfig::compile`] into a [`CompiledDecode`], run by `Model::compile`).
//!
//! The compiled form is shared by every consumer lane, the deferral and the reconciler behind an
//! `Arc`: its derived fields' CEL programs, its field sources parsed, and the schema its binary
//! events are read with (an Avro schema or a Protobuf message type read from its file once, or
//! the registry's settings with their CA certificates read once). Nothing reads a file again,
//! so a file changed after `tally check`, or after the start, changes nothing in a running
//! process. These are the configuration's compiled parts, not the decoder: the decoder
//! (`stream/decode/`) builds its field paths and schema plans from them, in memory, as the stage
//! that reads events must not be imported by the configuration (`tally-layers` checks it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use prost_reflect::MessageDescriptor;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cel::Program;
use super::fields::FieldSource;
use super::validate::{ensure, invalid};
use super::ConfigError;

/// How payloads are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// A JSON object.
    #[default]
    Json,
    /// Avro binary: framed with a schema registry id (Confluent wire format: byte 0, a 4-byte
    /// big-endian schema id, the datum) when `schema_registry` is set, or bare datums of
    /// `schema_file`.
    Avro,
    /// Protobuf: framed with a schema registry id and the message indexes (Confluent wire
    /// format) when `schema_registry` is set, or bare messages of `decode.message` in
    /// `descriptor_file`.
    Protobuf,
}

/// `[decode.schema_registry]`: where Avro and Protobuf writer schemas are fetched by id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URL (`http://` or `https://`), e.g. `http://registry:8081`.
    pub url: String,
    /// Basic authentication user.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic authentication password (prefer the environment:
    /// `TALLY_DECODE__SCHEMA_REGISTRY__PASSWORD`).
    #[serde(default)]
    pub password: Option<String>,
    /// Time allowed for one request; a registry that does not answer is asked again (the
    /// partition waits: nothing is skipped).
    #[serde(with = "humantime_serde", default = "default_registry_timeout")]
    pub timeout: Duration,
    /// With an `https://` URL: a PEM file of the CA certificate(s) the registry's certificate
    /// is checked against, instead of the built-in web roots (a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl RegistryConfig {
    /// The certificates of `ca_file` (none without one); an error names the file and why.
    fn ca_certificates(&self) -> Result<Vec<ureq::tls::Certificate<'static>>, ConfigError> {
        let Some(path) = &self.ca_file else {
            return Ok(Vec::new());
        };
        let why = |e: &dyn std::fmt::Display| {
            invalid(
                "decode.schema_registry.ca_file",
                format!("{}: {e}", path.display()),
            )
        };
        let pem = std::fs::read(path).map_err(|e| why(&e))?;
        let mut certs = Vec::new();
        for item in ureq::tls::parse_pem(&pem) {
            match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
                Ok(_) => {}
                Err(e) => return Err(why(&e)),
            }
        }
        match certs.is_empty() {
            true => Err(why(&"no PEM certificate in it")),
            false => Ok(certs),
        }
    }
}

fn default_registry_timeout() -> Duration {
    Duration::from_secs(5)
}

/// Decoding of message payloads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeConfig {
    /// `json`, `avro` or `protobuf`.
    pub format: Format,
    /// Avro, Protobuf: the schema registry the framed events' schema ids are looked up in.
    pub schema_registry: Option<RegistryConfig>,
    /// Avro without a registry: the `.avsc` file every (unframed) datum is written with.
    pub schema_file: Option<std::path::PathBuf>,
    /// Protobuf without a registry: a descriptor set (`protoc --include_imports
    /// --descriptor_set_out`) holding `message`, the type of every (unframed) message.
    pub descriptor_file: Option<std::path::PathBuf>,
    /// Protobuf with `descriptor_file`: the full name of the events' message type
    /// (`package.Message`).
    pub message: Option<String>,
    /// Field holding the event time; absent → the Kafka message timestamp is used.
    pub time_field: Option<String>,
    /// How `time_field` is written.
    pub time_format: TimeFormat,
    /// Larger payloads are rejected as `too_large`.
    pub max_message_bytes: usize,
    /// Longer dimension values are rejected as `too_large` (they would make huge keys).
    pub max_value_bytes: usize,
    /// A writer schema that compiles to more nodes (Avro: types, fields, enum symbols, each
    /// named type once; Protobuf: messages, fields, enums and their values) is refused: a
    /// `schema_file` or `descriptor_file` by `tally check`, a registry schema's events as
    /// `schema_too_large`. Bounds the memory and time one schema can cost.
    pub max_schema_nodes: usize,
    /// With a schema registry: the compiled schemas a lane keeps, by id (the least recently
    /// used forgotten first, and fetched again when an event carries it). Bounds what a
    /// producer cycling through many ids can make tally hold.
    pub max_schemas: usize,
    /// Kafka topic that receives a copy of every undecodable message (with reason headers).
    pub dead_letter_topic: Option<String>,
    /// Events timed further than this after the current time are rejected as `future_time`
    /// (a wrong clock or unit would otherwise create keys that live for centuries).
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    /// Where named fields are read from (see [`FieldSource`]): a path into the payload, the
    /// record key, a header, the topic or the partition. A name not listed is the payload's
    /// top-level field of that name.
    pub fields: BTreeMap<String, String>,
    /// Fields computed from other fields with a CEL expression (e.g. `status_class =
    /// 'string(status / 100) + "xx"'`), usable as dimensions, members, values and in filters.
    pub derive: BTreeMap<String, String>,
}

/// Encodings accepted for the event-time field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeFormat {
    /// Integer milliseconds since the Unix epoch.
    EpochMs,
    /// Integer (or fractional) seconds since the Unix epoch.
    EpochS,
    /// An RFC 3339 string such as `2025-08-01T17:03:00Z`.
    Rfc3339,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            format: Format::Json,
            schema_registry: None,
            schema_file: None,
            descriptor_file: None,
            message: None,
            time_field: None,
            time_format: TimeFormat::EpochMs,
            max_message_bytes: 1 << 20,
            max_value_bytes: 256,
            max_schema_nodes: 100_000,
            max_schemas: 1_000,
            dead_letter_topic: None,
            max_future: Duration::from_secs(86_400),
            fields: BTreeMap::new(),
            derive: BTreeMap::new(),
        }
    }
}

impl DecodeConfig {
    /// Size limits and the future bound are positive. (How the time field relates to the
    /// counters' fields is checked with the counters.) The checks of [`DecodeConfig::compile`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.compile().map(drop)
    }

    /// Check the section and compile it: parse the field sources, compile the derived fields,
    /// read the schema file (or the registry's CA file) once. Every error names its key.
    pub fn compile(&self) -> Result<CompiledDecode, ConfigError> {
        ensure(
            self.max_message_bytes > 0 && self.max_value_bytes > 0,
            "decode.max_message_bytes",
            "limits must be positive",
        )?;
        ensure(
            self.max_schema_nodes > 0,
            "decode.max_schema_nodes",
            "must be positive",
        )?;
        ensure(
            self.max_schemas > 0,
            "decode.max_schemas",
            "must be positive",
        )?;
        ensure(
            !self.max_future.is_zero(),
            "decode.max_future",
            "must be positive (e.g. \"1d\")",
        )?;
        let mut sources = BTreeMap::new();
        for (name, source) in &self.fields {
            let key = || format!("decode.fields.{name}");
            ensure(!name.is_empty(), key(), "a field name is not empty")?;
            let parsed = FieldSource::parse(source).map_err(|e| invalid(key(), e.to_string()))?;
            sources.insert(name.clone(), parsed);
        }
        let schema = self.compile_format()?;
        let mut derived = BTreeMap::new();
        for (name, text) in &self.derive {
            let key = || format!("decode.derive.{name}");
            ensure(
                !self.fields.contains_key(name),
                key(),
                "is also in [decode.fields]: a field is read or derived, not both",
            )?;
            let program = Program::compile(text).map_err(|e| invalid(key(), e.to_string()))?;
            if let Some(v) = program.vars().iter().find(|v| self.derive.contains_key(*v)) {
                return Err(invalid(
                    key(),
                    format!("reads `{v}`, another derived field: derive from read fields only"),
                ));
            }
            derived.insert(name.clone(), program);
        }
        Ok(CompiledDecode {
            config: self.clone(),
            sources,
            derived,
            schema,
        })
    }

    /// Avro and Protobuf name exactly one schema source, read now; JSON names none.
    fn compile_format(&self) -> Result<SchemaSource, ConfigError> {
        let Some(file) = self.check_format_keys()? else {
            return Ok(SchemaSource::Json);
        };
        let (key, sources) = match self.format {
            Format::Protobuf => ("decode.descriptor_file", "[decode.schema_registry] (framed events) or decode.descriptor_file with decode.message (bare messages)"),
            _ => ("decode.schema_file", "[decode.schema_registry] (framed events) or decode.schema_file (bare datums)"),
        };
        match (&self.schema_registry, file) {
            (Some(_), Some(_)) | (None, None) => Err(invalid(
                "decode.format",
                format!("{:?} needs one schema source: {sources}", self.format).to_lowercase(),
            )),
            (Some(r), None) => Ok(SchemaSource::Registry(Arc::new(r.compile()?))),
            (None, Some(path)) => {
                let why = |e: String| invalid(key, format!("{}: {e}", path.display()));
                let bytes = std::fs::read(path).map_err(|e| why(e.to_string()))?;
                match self.format {
                    Format::Protobuf => {
                        let name = self.message.as_deref().unwrap_or_default();
                        let message = super::proto::message(&bytes, name, self.max_schema_nodes)
                            .map_err(|e| why(e.to_string()))?;
                        Ok(SchemaSource::ProtobufFile(message))
                    }
                    _ => {
                        let text = String::from_utf8(bytes).map_err(|e| why(e.to_string()))?;
                        let schema = super::avro::schema(&text, self.max_schema_nodes)
                            .map_err(|e| why(e.to_string()))?;
                        Ok(SchemaSource::AvroFile(Arc::new(schema)))
                    }
                }
            }
        }
    }

    /// Which keys go with which format; the schema file the format names (Avro, Protobuf), or
    /// None for JSON.
    fn check_format_keys(&self) -> Result<Option<Option<&PathBuf>>, ConfigError> {
        match self.format {
            Format::Json => {
                let none = self.schema_registry.is_none()
                    && self.schema_file.is_none()
                    && self.descriptor_file.is_none()
                    && self.message.is_none();
                ensure(
                    none,
                    "decode.format",
                    "schema_registry, schema_file, descriptor_file and message are for format = \"avro\" or \"protobuf\"",
                )?;
                Ok(None)
            }
            Format::Avro => {
                ensure(
                    self.descriptor_file.is_none() && self.message.is_none(),
                    "decode.format",
                    "descriptor_file and message are for format = \"protobuf\" (avro reads schema_file)",
                )?;
                Ok(Some(self.schema_file.as_ref()))
            }
            Format::Protobuf => {
                ensure(
                    self.schema_file.is_none(),
                    "decode.format",
                    "schema_file is for format = \"avro\" (protobuf reads descriptor_file)",
                )?;
                ensure(
                    self.message.is_some() == self.descriptor_file.is_some(),
                    "decode.message",
                    "descriptor_file and message go together: the file, and the events' message type in it",
                )?;
                Ok(Some(self.descriptor_file.as_ref()))
            }
        }
    }
}

impl RegistryConfig {
    /// The settings checked, with the CA certificates read.
    fn compile(&self) -> Result<RegistrySettings, ConfigError> {
        let ok = self.url.starts_with("http://") || self.url.starts_with("https://");
        ensure(
            ok,
            "decode.schema_registry.url",
            "an http:// or https:// URL",
        )?;
        ensure(
            !self.timeout.is_zero(),
            "decode.schema_registry.timeout",
            "must be positive",
        )?;
        if self.ca_file.is_some() {
            ensure(
                self.url.starts_with("https://"),
                "decode.schema_registry.ca_file",
                "is for an https:// url",
            )?;
        }
        let ca = self.ca_certificates()?;
        Ok(RegistrySettings {
            config: self.clone(),
            ca,
        })
    }
}

/// A `[decode]` section, compiled.
#[derive(Debug)]
pub struct CompiledDecode {
    /// The settings as written (time field and format, limits, dead letters).
    pub config: DecodeConfig,
    /// `[decode.fields]`, parsed.
    pub(super) sources: BTreeMap<String, FieldSource>,
    /// `[decode.derive]`, compiled, by field name.
    pub derived: BTreeMap<String, Program>,
    /// Where binary events' schemas come from.
    pub schema: SchemaSource,
}

/// Where the schemas of a topic's events come from, read once.
#[derive(Debug, Clone)]
pub enum SchemaSource {
    /// JSON: no schema.
    Json,
    /// Avro: bare datums of `decode.schema_file`, its schema parsed.
    AvroFile(Arc<apache_avro::Schema>),
    /// Protobuf: bare messages of `decode.message`, from `decode.descriptor_file`.
    ProtobufFile(MessageDescriptor),
    /// Avro or Protobuf framed with the ids of `[decode.schema_registry]`.
    Registry(Arc<RegistrySettings>),
}

/// `[decode.schema_registry]` with its CA certificates read.
#[derive(Debug)]
pub struct RegistrySettings {
    /// The settings as written.
    pub config: RegistryConfig,
    /// The certificates of `ca_file` (none without one: the built-in web roots).
    pub ca: Vec<ureq::tls::Certificate<'static>>,
}

impl Default for CompiledDecode {
    /// `DecodeConfig::default()` compiled: JSON, every field at the top level, nothing derived.
    fn default() -> CompiledDecode {
        CompiledDecode {
            config: DecodeConfig::default(),
            sources: BTreeMap::new(),
            derived: BTreeMap::new(),
            schema: SchemaSource::Json,
        }
    }
}

impl CompiledDecode {
    /// Where the field `name` is read from: its `[decode.fields]` entry, else the payload's
    /// top-level field of that name.
    pub fn source(&self, name: &str) -> FieldSource {
        self.sources
            .get(name)
            .cloned()
            .unwrap_or_else(|| FieldSource::top_level(name))
    }

    /// Whether `[decode.fields]` lists `name`.
    pub fn lists(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }
}
