//! Decoding (`src/stream/decode/`): JSON fields, Avro and Protobuf through a schema registry, and
//! the budgets that keep hostile schemas out.

mod avro;
mod avro_budget;
mod fields;
mod protobuf;
mod protobuf_budget;
mod schema_registry;
mod schema_registry_wait;
