//! The configuration compiled once. [`Model::compile`] validates a [`Config`] and compiles every
//! counter into a [`CounterSpec`] (and its filter into a CEL [`Program`]), each topic's decoding
//! into a [`CompiledDecode`] (derived fields, field sources, the schema read from its file), the
//! Redis key layout and the fence scope; every path of the process (consumer lanes, queries, the
//! request path, jobs, the reconciler, deferral) takes the same `Arc<Model>` instead of compiling
//! from raw configuration again, and nothing reads a configured file a second time.

use std::sync::Arc;

use tally_counters::model::layout::Layout;
use tally_counters::model::state_keys::FenceScope;
use tally_counters::model::CounterSpec;

use super::cel::Program;
use super::decode::CompiledDecode;
use super::limits::Limits;
use super::validate::invalid;
use super::{Config, ConfigError};

/// The secrets the request path's ports check (HTTP `/v1` and the RLS), read once.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// Needed by every call (the admin token passes too); None: open. From `http.token` or
    /// `http.token_file`.
    pub token: Option<String>,
    /// Needed by destructive calls (`http.admin_token`); None: every caller may make them.
    pub admin: Option<String>,
}

/// One topic the stream reads, compiled: its decoding, where its fences live, and which
/// counters count its events.
#[derive(Debug, Clone)]
pub struct Topic {
    /// The topic's name.
    pub name: String,
    /// How its messages become events (its own `decode`, or `[decode]`), compiled once and
    /// shared by every lane that reads it.
    pub decode: Arc<CompiledDecode>,
    /// The names of its state keys: fences are per (group, topic, partition, shard).
    pub scope: FenceScope,
    /// By counter, in model order: whether the counter counts this topic's events.
    pub reads: Vec<bool>,
}

/// What validation compiles, kept by `Model::compile` so that nothing is compiled twice.
struct Checked {
    /// Every counter, compiled, in config order.
    counters: Vec<CounterSpec>,
    /// Each counter's filter, compiled (config order; None: no filter).
    filters: Vec<Option<Program>>,
    /// The decoding of each entry of [`Config::topics`], compiled (entries without their own
    /// share `[decode]`'s).
    decodes: Vec<Arc<CompiledDecode>>,
}

impl Config {
    /// Every section's own rules, then the counters'. The counters come back compiled, in
    /// config order: checking that no two of them can write one key needs them compiled, and
    /// whoever runs the process should not compile them a second time.
    pub fn validate(&self) -> Result<Vec<CounterSpec>, ConfigError> {
        self.check().map(|checked| checked.counters)
    }

    /// [`Config::validate`], keeping everything it compiled.
    fn check(&self) -> Result<Checked, ConfigError> {
        self.kafka.validate()?;
        self.redis.validate()?;
        let decodes = self.validate_topics()?;
        self.flush.validate()?;
        self.recovery.validate()?;
        self.http.validate()?;
        self.request.validate()?;
        self.jobs.validate()?;
        self.status.validate()?;
        self.rls.validate()?;
        self.rlqs.validate()?;
        self.log.validate()?;
        let (counters, filters) = self.validate_counters()?;
        Ok(Checked {
            counters,
            filters,
            decodes,
        })
    }
}

/// A validated configuration and what is compiled from it. Immutable; shared behind an `Arc`.
#[derive(Debug)]
pub struct Model {
    /// The configuration as loaded (inert data: timeouts, addresses, policies).
    pub config: Config,
    /// Every counter, compiled, in configuration order.
    pub counters: Vec<CounterSpec>,
    /// Each counter's filter (`counters[].filter`), compiled; None: it takes every event.
    pub filters: Vec<Option<Program>>,
    /// Where counter keys live (plain keys standalone, hash tags per shard in a cluster).
    pub layout: Layout,
    /// The names of the first topic's state keys (applied offsets, markers), also where the
    /// window publisher keeps its progress. Each topic's own are in `topics`.
    pub scope: FenceScope,
    /// Every topic listed by name (`kafka.topics`, or `kafka.topic`), in configuration order.
    pub topics: Vec<Topic>,
    /// The topic patterns of `kafka.topics`, in configuration order: the topics they match
    /// are found at run time and compiled by [`Model::pattern_topic`].
    pub patterns: Vec<super::TopicPattern>,
    /// The decoding of each entry of [`Config::topics`] (a pattern's for the topics it matches).
    decodes: Vec<Arc<CompiledDecode>>,
    /// The secrets of the request path's ports, read once (a token file is not read again).
    pub tokens: Tokens,
    /// The RLS limits file (`rls.limits_file`) as loaded at start; a reload replaces the
    /// service's copy, not this one. None without `rls.listen`.
    pub rls_limits: Option<Arc<Limits>>,
}

impl Model {
    /// Validate `config` and compile it; the errors are those of [`Config::validate`].
    pub fn compile(config: Config) -> Result<Arc<Model>, ConfigError> {
        let checked = config.check()?;
        let tokens = Tokens {
            token: config.http.bearer_token()?,
            admin: config.http.admin_token()?,
        };
        if tokens.admin.is_some() && tokens.admin == tokens.token {
            return Err(invalid("http.admin_token", "must differ from http.token"));
        }
        if !config.rlqs.buckets.is_empty() && config.rls.listen.is_empty() {
            return Err(invalid(
                "rlqs.buckets",
                "the quota service is served on rls.listen, which is not set",
            ));
        }
        let rls_limits = match (&config.rls.listen[..], &config.rls.limits_file) {
            ("", _) | (_, None) => None,
            (_, Some(path)) => Some(Arc::new(
                Limits::load(path).map_err(|e| invalid("rls.limits_file", e.to_string()))?,
            )),
        };
        let topics: Vec<Topic> = config
            .topics()
            .iter()
            .filter(|t| !t.pattern)
            .map(|t| Topic {
                name: t.name.to_string(),
                decode: checked.decodes[t.index].clone(),
                scope: FenceScope::new(&config.redis, &config.kafka.group_id, t.name),
                reads: config
                    .counters
                    .iter()
                    .map(|c| super::counter_reads(c, t.name))
                    .collect(),
            })
            .collect();
        let patterns = config.topic_patterns();
        // The window publisher keeps its progress here; with patterns only (no window results,
        // validated), the first pattern's text names it.
        let scope = match (topics.first(), patterns.first()) {
            (Some(t), _) => t.scope.clone(),
            (None, p) => FenceScope::new(
                &config.redis,
                &config.kafka.group_id,
                p.map_or("", |p| p.text.as_str()),
            ),
        };
        Ok(Arc::new(Model {
            tokens,
            rls_limits,
            layout: Layout::for_config(&config.redis),
            scope,
            topics,
            patterns,
            counters: checked.counters,
            filters: checked.filters,
            decodes: checked.decodes,
            config,
        }))
    }

    /// `name`, a topic a pattern matches, compiled: the pattern's decoding, its fences, the
    /// counters that read it. None if no pattern decides how it is read, or no counter reads it.
    pub fn pattern_topic(&self, name: &str) -> Option<Topic> {
        let p = &self.patterns[self.config.pattern_for(&self.patterns, name)?];
        let reads: Vec<bool> = self
            .config
            .counters
            .iter()
            .map(|c| p.read_by(c, name))
            .collect();
        if !reads.contains(&true) {
            return None;
        }
        Some(Topic {
            name: name.to_string(),
            decode: self.decodes[p.index].clone(),
            scope: FenceScope::new(&self.config.redis, &self.config.kafka.group_id, name),
            reads,
        })
    }

    /// Where deferred hits go: the first listed topic, if it is listed by name (a pattern's
    /// topics are not known up front: nothing is deferred).
    pub fn defer_topic(&self) -> Option<&Topic> {
        let first = self.config.kafka.topics.first();
        match first.is_none_or(|t| t.pattern.is_none()) {
            true => self.topics.first(),
            false => None,
        }
    }

    /// The topic named `name`.
    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.iter().find(|t| t.name == name)
    }

    /// The first topic listed by name: the one of the single-topic form. (Validated
    /// configurations without one read patterns only; the stream's stages then come from
    /// [`Model::pattern_topic`].)
    pub fn first_topic(&self) -> &Topic {
        &self.topics[0]
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
