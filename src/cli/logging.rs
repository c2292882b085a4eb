//! The process's log filter: `TALLY_LOG` when set, else the configuration's `log.level`, which
//! `tally run` and `tally serve` read again from their configuration on SIGHUP.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use tally::config::{Config, DEFAULT_LOG};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{reload, EnvFilter, Registry};

static HANDLE: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
/// Where SIGHUP reads `log.level` from: the command's configuration file and flags.
static SOURCE: Mutex<Option<(Option<PathBuf>, serde_json::Value)>> = Mutex::new(None);

fn from_env() -> bool {
    std::env::var_os("TALLY_LOG").is_some()
}

/// Log to stderr with `TALLY_LOG`'s filter, or the default until the configuration is read.
pub fn init() {
    let filter =
        EnvFilter::try_from_env("TALLY_LOG").unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    let (filter, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
    let _ = HANDLE.set(handle);
}

/// Put `config`'s `log.level` in force (unless `TALLY_LOG` is set), and remember where it came
/// from (`file` and the command line's `overrides`) for SIGHUP.
pub fn follow(config: &Config, file: Option<PathBuf>, overrides: serde_json::Value) {
    if !from_env() {
        apply(&config.log.level);
    }
    *SOURCE.lock().unwrap_or_else(|e| e.into_inner()) = Some((file, overrides));
}

/// SIGHUP: read `log.level` again (the whole configuration must load, else nothing changes).
pub fn reload() {
    let source = SOURCE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let Some((file, overrides)) = source else {
        return;
    };
    if from_env() {
        tracing::info!("SIGHUP: TALLY_LOG is set; the log filter stays");
        return;
    }
    match Config::load(file.as_deref(), &overrides) {
        Ok(config) => {
            if apply(&config.log.level) {
                tracing::info!(level = %config.log.level, "SIGHUP: log filter (log.level) in force");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: the configuration does not load; the log filter stays")
        }
    }
}

/// Whether `level` parsed and is now the filter.
fn apply(level: &str) -> bool {
    let Some(handle) = HANDLE.get() else {
        return false;
    };
    match EnvFilter::try_new(level) {
        Ok(filter) => handle.reload(filter).is_ok(),
        Err(e) => {
            tracing::error!(error = %e, "log.level is not a filter; the log filter stays");
            false
        }
    }
}
