//! The process's log filter: `TALLY_LOG` when set, else the configuration's `log.level`, which
//! `tally run` and `tally serve` read again from their configuration on SIGHUP; and its format:
//! `TALLY_LOG_FORMAT` when set, else `log.format` (text, coloured only on a terminal, or JSON).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use tally::config::{Config, LogFormat, DEFAULT_LOG};
use tracing_subscriber::layer::Layered;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{fmt, reload, EnvFilter, Layer, Registry};

/// The subscriber under the output layer: the registry with the filter.
type Filtered = Layered<reload::Layer<EnvFilter, Registry>, Registry>;
/// The output layer (text or JSON lines to stderr).
type Output = Box<dyn Layer<Filtered> + Send + Sync>;

static HANDLE: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static OUTPUT: OnceLock<reload::Handle<Output, Filtered>> = OnceLock::new();
/// Where SIGHUP reads `log.level` from: the command's configuration file and flags.
static SOURCE: Mutex<Option<(Option<PathBuf>, serde_json::Value)>> = Mutex::new(None);

fn from_env() -> bool {
    std::env::var_os("TALLY_LOG").is_some()
}

/// `TALLY_LOG_FORMAT`, when set to a format (read once: a wrong value is said once).
fn format_from_env() -> Option<LogFormat> {
    static FORMAT: OnceLock<Option<LogFormat>> = OnceLock::new();
    *FORMAT.get_or_init(|| {
        let value = std::env::var("TALLY_LOG_FORMAT").ok()?;
        value
            .parse()
            .map_err(|e| eprintln!("TALLY_LOG_FORMAT: {e}; log.format applies"))
            .ok()
    })
}

/// Lines to stderr in `format`; text has colour only when stderr is a terminal (escape codes
/// in a file or a log shipper's input are noise).
fn output(format: LogFormat) -> Output {
    match format {
        LogFormat::Text => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
}

/// Log to stderr with `TALLY_LOG`'s filter (or the default) in `TALLY_LOG_FORMAT`'s format (or
/// text), until the configuration is read.
pub fn init() {
    let filter =
        EnvFilter::try_from_env("TALLY_LOG").unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    let (filter, handle) = reload::Layer::new(filter);
    let (out, out_handle) = reload::Layer::new(output(format_from_env().unwrap_or_default()));
    tracing_subscriber::registry().with(filter).with(out).init();
    let _ = HANDLE.set(handle);
    let _ = OUTPUT.set(out_handle);
}

/// Put `format` in force unless `TALLY_LOG_FORMAT` is set.
fn apply_format(format: LogFormat) {
    if format_from_env().is_some() {
        return;
    }
    if let Some(handle) = OUTPUT.get() {
        let _ = handle.reload(output(format));
    }
}

/// Put `config`'s `log.level` in force (unless `TALLY_LOG` is set), and remember where it came
/// from (`file` and the command line's `overrides`) for SIGHUP.
pub fn follow(config: &Config, file: Option<PathBuf>, overrides: serde_json::Value) {
    apply_format(config.log.format);
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
