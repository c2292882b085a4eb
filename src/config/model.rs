//! The configuration compiled once. [`Model::compile`] validates a [`Config`] and compiles every
//! counter into a [`CounterSpec`], the Redis key layout and the fence scope; every path of the
//! process (consumer lanes, queries, the request path, jobs, the reconciler, deferral) takes the
//! same `Arc<Model>` instead of compiling from raw configuration again.

use std::sync::Arc;

use tally_counters::model::layout::Layout;
use tally_counters::model::state_keys::FenceScope;
use tally_counters::model::CounterSpec;

use super::{Config, ConfigError};

/// A validated configuration and what is compiled from it. Immutable; shared behind an `Arc`.
#[derive(Debug)]
pub struct Model {
    /// The configuration as loaded (inert data: timeouts, addresses, policies).
    pub config: Config,
    /// Every counter, compiled, in configuration order.
    pub counters: Vec<CounterSpec>,
    /// Where counter keys live (plain keys standalone, hash tags per shard in a cluster).
    pub layout: Layout,
    /// The names of this consumer group's state keys (applied offsets, markers).
    pub scope: FenceScope,
}

impl Model {
    /// Validate `config` and compile it; the errors are those of [`Config::validate`].
    pub fn compile(config: Config) -> Result<Arc<Model>, ConfigError> {
        let counters = config.validate()?;
        Ok(Arc::new(Model {
            layout: Layout::for_config(&config.redis),
            scope: FenceScope::new(&config.redis, &config.kafka.group_id, &config.kafka.topic),
            counters,
            config,
        }))
    }

    /// The counter named `name`.
    pub fn counter(&self, name: &str) -> Option<&CounterSpec> {
        self.counters.iter().find(|c| c.name == name)
    }

    /// Whether some counter publishes its windows (the stream then records watermarks).
    pub fn has_outputs(&self) -> bool {
        self.counters.iter().any(|c| c.output.is_some())
    }

    /// Every counter's name, in configuration order (metric label values).
    pub fn counter_names(&self) -> Vec<String> {
        self.counters.iter().map(|c| c.name.clone()).collect()
    }
}
