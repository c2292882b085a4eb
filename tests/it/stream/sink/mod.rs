//! The sink (`src/stream/sink/`): the Lua scripts' replies, chunked flushes, spread expiry, and
//! what an AOF can do to a transaction.

mod aof;
mod bounded_flush;
mod expiry_spread;
mod scripts;
