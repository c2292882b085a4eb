//! The command line's subcommands beyond `run`, `serve` and `check` (binary only).

pub mod args;
pub mod common;
#[cfg(feature = "dev")]
pub mod demo;
pub mod inspect;
pub mod logging;
pub mod request;
pub mod top;
