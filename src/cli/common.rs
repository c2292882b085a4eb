//! What every command that reads a configuration shares: `--config` and the overrides.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde_json::{json, Value};
use tally::config::{Config, Model};

use crate::config_error;

/// A command-line value clap cannot take (its message is clap's error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArgError {
    /// Not `name=value`.
    #[error("`{0}` is not name=value")]
    NotNameValue(String),
    /// Not an action of the limiter.
    #[error("`{0}`: use apply, peek, reset, release or fill")]
    UnknownAction(String),
}

pub(crate) fn parse_dim(s: &str) -> Result<(String, String), ArgError> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| ArgError::NotNameValue(s.to_string()))
}

/// Options shared by the commands that read a configuration.
#[derive(Args)]
pub(crate) struct Common {
    /// TOML configuration file.
    #[arg(long, short, env = "TALLY_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Kafka bootstrap servers (kafka.brokers).
    #[arg(long)]
    pub(crate) brokers: Option<String>,
    /// Topic to consume (kafka.topic).
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Consumer group (kafka.group_id).
    #[arg(long)]
    pub(crate) group_id: Option<String>,
    /// Redis URL (redis.url).
    #[arg(long)]
    pub(crate) redis_url: Option<String>,
    /// Address for /metrics and /health (http.listen).
    #[arg(long)]
    pub(crate) listen: Option<String>,
}

impl Common {
    pub(crate) fn overrides(&self) -> Value {
        let mut root = json!({});
        let mut set = |section: &str, key: &str, value: &Option<String>| {
            if let Some(v) = value {
                root.as_object_mut()
                    .expect("object")
                    .entry(section)
                    .or_insert_with(|| json!({}))[key] = json!(v);
            }
        };
        set("kafka", "brokers", &self.brokers);
        set("kafka", "topic", &self.topic);
        set("kafka", "group_id", &self.group_id);
        set("redis", "url", &self.redis_url);
        set("http", "listen", &self.listen);
        root
    }

    pub(crate) fn load(&self) -> Result<Config, ExitCode> {
        Config::load(self.config.as_deref(), &self.overrides()).map_err(config_error)
    }

    /// The configuration, validated and compiled.
    pub(crate) fn model(&self) -> Result<Arc<Model>, ExitCode> {
        let config =
            Config::read(self.config.as_deref(), &self.overrides()).map_err(config_error)?;
        Model::compile(config).map_err(config_error)
    }
}
