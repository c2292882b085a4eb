//! Why an event was not read: one reason per metric label value.

/// Why a message was skipped. Each maps to one `reason` label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message had no payload.
    #[error("empty payload")]
    Empty,
    /// The payload or a dimension value exceeded its configured limit.
    #[error("payload or value too large")]
    TooLarge,
    /// The payload is not valid UTF-8.
    #[error("payload is not UTF-8")]
    NotUtf8,
    /// The payload is not a JSON object.
    #[error("payload is not a JSON object")]
    NotJson,
    /// A required field is absent (or null).
    #[error("a required field is missing")]
    MissingField,
    /// A field has a type the counter cannot use (e.g. an object as a dimension, a float value).
    #[error("a field has the wrong type")]
    WrongType,
    /// The event time could not be read, or no timestamp was available.
    #[error("bad event timestamp")]
    BadTimestamp,
    /// The event time lies further in the future than `decode.max_future` allows.
    #[error("event time too far in the future")]
    FutureTime,
    /// Adding the event's value would overflow a counter's 64-bit sum.
    #[error("value would overflow the counter")]
    Overflow,
    /// Not an Avro datum of its schema (or not a schema registry frame).
    #[error("payload is not avro")]
    NotAvro,
    /// Not a Protobuf message of its schema (or not a schema registry frame).
    #[error("payload is not protobuf")]
    NotProtobuf,
    /// The schema id is unknown to the registry, or its schema cannot be read.
    #[error("unknown or unusable schema")]
    UnknownSchema,
    /// The event's schema is not known yet (the registry is being asked on another thread,
    /// or did not answer): the event was not read and must be read again (never skipped,
    /// never counted as bad input).
    #[error("schema registry unavailable")]
    Unavailable,
    /// The schema compiles to more than `decode.max_schema_nodes` nodes: refused, not compiled.
    #[error("schema over the node budget")]
    SchemaTooLarge,
    /// The event holds more items than its size allows (arrays of values that take no bytes)
    /// or nests deeper than the reader goes: refused before it costs more than its bytes.
    #[error("event over the decode budget")]
    TooComplex,
    /// The registry kept failing for the event's schema id (a 5xx, an answer over 1 MiB or not
    /// a schema) while it answered other calls.
    #[error("the registry fails for this schema id")]
    RegistryError,
}

impl DecodeError {
    /// Every reason, in `index` order.
    pub const ALL: [DecodeError; 16] = [
        DecodeError::Empty,
        DecodeError::TooLarge,
        DecodeError::NotUtf8,
        DecodeError::NotJson,
        DecodeError::MissingField,
        DecodeError::WrongType,
        DecodeError::BadTimestamp,
        DecodeError::FutureTime,
        DecodeError::Overflow,
        DecodeError::NotAvro,
        DecodeError::NotProtobuf,
        DecodeError::UnknownSchema,
        DecodeError::Unavailable,
        DecodeError::SchemaTooLarge,
        DecodeError::TooComplex,
        DecodeError::RegistryError,
    ];

    /// The metric label for this error.
    pub fn reason(self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::TooLarge => "too_large",
            DecodeError::NotUtf8 => "not_utf8",
            DecodeError::NotJson => "not_json",
            DecodeError::MissingField => "missing_field",
            DecodeError::WrongType => "wrong_type",
            DecodeError::BadTimestamp => "bad_timestamp",
            DecodeError::FutureTime => "future_time",
            DecodeError::Overflow => "overflow",
            DecodeError::NotAvro => "not_avro",
            DecodeError::NotProtobuf => "not_protobuf",
            DecodeError::UnknownSchema => "unknown_schema",
            DecodeError::Unavailable => "unavailable",
            DecodeError::SchemaTooLarge => "schema_too_large",
            DecodeError::TooComplex => "too_complex",
            DecodeError::RegistryError => "registry_error",
        }
    }

    /// Index into [`DecodeError::ALL`], for per-batch counting without string lookups.
    pub fn index(self) -> usize {
        self as usize
    }
}
