//! The `tally` command line: run, serve, check, key, query, state, the request-path calls (hit,
//! limit, quota, once, unique, pool, lock) and, with the `dev` feature (default; the product is
//! built without it), the local tooling on the test kit (demo, mock-broker, produce).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use tally::config::{Config, Model, EXIT_CONFIG};

/// jemalloc, not glibc's malloc: 0.88× the CPU per event on the stream and 0.77–0.92× per
/// decision on the request path, for about 1.1× the memory (docs/benchmarks.md, session 10).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(feature = "dev")]
mod demo;
mod request_cli;
mod top;

#[derive(Parser)]
#[command(
    name = "tally",
    version,
    about = "Exact, time-windowed counters from a Kafka topic into Redis"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume the configured topic and maintain the counters (the service).
    #[command(after_help = "Example:\n  tally run --config tally.toml")]
    Run(Common),
    /// Everything on local parts: in-process Kafka broker, synthetic events, local redis-server.
    #[cfg(feature = "dev")]
    #[command(after_help = "Example:\n  tally demo --duration 30s --rate 20000")]
    Demo {
        #[command(flatten)]
        common: Common,
        /// Events per second to produce.
        #[arg(long, default_value_t = 20_000)]
        rate: u64,
        /// Partitions of the demo topic.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Distinct devices (keys per hour).
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// Stop after this long, e.g. 30s (default: until Ctrl-C).
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
    /// Validate the configuration and print it with defaults filled in.
    #[command(after_help = "Example:\n  tally check --config tally.toml")]
    Check(Common),
    /// Run an in-process Kafka-protocol broker (librdkafka mock cluster) for tests and benchmarks.
    #[cfg(feature = "dev")]
    #[command(after_help = "Example:\n  tally mock-broker --topic events:8")]
    MockBroker {
        /// Topics to create, as name:partitions.
        #[arg(long = "topic", default_value = "events:8")]
        topics: Vec<String>,
    },
    /// Produce synthetic JSON events to a topic at a target rate (load generator).
    #[cfg(feature = "dev")]
    #[command(
        after_help = "Example:\n  tally produce --brokers 127.0.0.1:9092 --topic events --rate 10000"
    )]
    Produce(tally_testkit::produce::ProduceArgs),
    /// Print the Redis key of a counter for given dimension values (and time).
    #[command(
        after_help = "Example:\n  tally key --config tally.toml --counter flow --dim app_id=a1 --dim device_id=d1 --dim ip=10.0.0.1"
    )]
    Key(KeyArgs),
    /// Print a counter's key and current value, read from Redis.
    #[command(
        after_help = "Example:\n  tally query --config tally.toml --counter minute --dim ip=10.0.0.1 --last 60"
    )]
    Query(KeyArgs),
    /// Inspect (and with `repair`, fix) tally's own state in Redis: applied offsets per partition.
    #[command(
        after_help = "Example:\n  tally state --config tally.toml; tally state --config tally.toml repair --partition 3"
    )]
    State(StateArgs),
    /// The live status of one or several tally processes in the terminal (their `/v1/status`).
    #[command(
        after_help = "Example:\n  tally top http://10.0.0.1:9100 http://10.0.0.2:9100 --token \"$TOKEN\"\n  Keys: q, Esc or Ctrl-C quits."
    )]
    Top(TopArgs),
    /// Serve the request path (hit, limit, quota, once, unique, pool) over HTTP, without Kafka.
    #[command(after_help = "Example:\n  tally serve --config tally.toml")]
    Serve(Common),
    #[command(flatten)]
    Request(request_cli::RequestCommand),
}

/// `tally top [URL…]`.
#[derive(Args)]
struct TopArgs {
    /// Base URLs of tally processes (default: http://127.0.0.1:9100).
    urls: Vec<String>,
    /// Bearer token, when the processes set `http.token`.
    #[arg(long, env = "TALLY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Time between two refreshes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
}

/// `tally state [repair --partition P [--offset N]]`.
#[derive(Args)]
struct StateArgs {
    #[command(flatten)]
    common: Common,
    /// Also show these partitions (comma separated) even if Redis has nothing for them.
    #[arg(long, value_delimiter = ',')]
    partitions: Vec<i32>,
    #[command(subcommand)]
    action: Option<StateAction>,
}

#[derive(Subcommand)]
enum StateAction {
    /// Set a halted partition's applied offset on every shard: to --offset, or to the state
    /// marker's copy (exact when only the offset key was lost).
    Repair {
        /// The partition to repair.
        #[arg(long)]
        partition: i32,
        /// The offset Redis has counted up to (next offset to count).
        #[arg(long)]
        offset: Option<i64>,
    },
}

/// Which counter value to look up.
#[derive(Args)]
struct KeyArgs {
    #[command(flatten)]
    common: Common,
    /// Counter name, e.g. flow (may be left out when only one counter is configured).
    #[arg(long)]
    counter: Option<String>,
    /// A dimension value as name=value; repeat for each dimension.
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, String)>,
    /// The time whose window to read: RFC 3339 or epoch ms (default: now).
    #[arg(long)]
    at: Option<String>,
    /// `tally query`: the last N windows up to now, per window and combined.
    #[arg(long, conflicts_with_all = ["at", "from"])]
    last: Option<usize>,
    /// `tally query`: every window from this time (with --to).
    #[arg(long, requires = "to", conflicts_with = "at")]
    from: Option<String>,
    /// `tally query`: ... to this time.
    #[arg(long, requires = "from")]
    to: Option<String>,
    /// `tally query`: print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// `tally query`: leaderboards list this many best members.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

fn parse_dim(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not name=value"))
}

/// Options shared by the commands that read a configuration.
#[derive(Args)]
struct Common {
    /// TOML configuration file.
    #[arg(long, short, env = "TALLY_CONFIG")]
    config: Option<PathBuf>,
    /// Kafka bootstrap servers (kafka.brokers).
    #[arg(long)]
    brokers: Option<String>,
    /// Topic to consume (kafka.topic).
    #[arg(long)]
    topic: Option<String>,
    /// Consumer group (kafka.group_id).
    #[arg(long)]
    group_id: Option<String>,
    /// Redis URL (redis.url).
    #[arg(long)]
    redis_url: Option<String>,
    /// Address for /metrics and /health (http.listen).
    #[arg(long)]
    listen: Option<String>,
}

impl Common {
    fn overrides(&self) -> Value {
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

    fn load(&self) -> Result<Config, ExitCode> {
        Config::load(self.config.as_deref(), &self.overrides()).map_err(config_error)
    }

    /// The configuration, validated and compiled.
    fn model(&self) -> Result<Arc<Model>, ExitCode> {
        let config =
            Config::read(self.config.as_deref(), &self.overrides()).map_err(config_error)?;
        Model::compile(config).map_err(config_error)
    }
}

/// Report a bad configuration; exit 64 (EX_USAGE) before anything starts.
fn config_error(e: tally::config::ConfigError) -> ExitCode {
    eprintln!("tally: {e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TALLY_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,librdkafka=warn,rdkafka=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Cancel `token` on SIGINT or SIGTERM. Both handlers are installed before this returns, so a
/// signal that arrives while the command starts is a clean shutdown, not the default exit.
fn on_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal received, shutting down");
        token.cancel();
    });
    Ok(())
}

/// A command whose configuration (if it has one) has been loaded and validated.
enum Prepared {
    /// The model, and the file it came from (named in repair commands).
    Run(Arc<Model>, Option<PathBuf>),
    Top(TopArgs),
    Check(Config),
    #[cfg(feature = "dev")]
    Demo(Config, demo::DemoOptions),
    #[cfg(feature = "dev")]
    MockBroker(Vec<String>),
    #[cfg(feature = "dev")]
    Produce(tally_testkit::produce::ProduceArgs),
    Key(Arc<Model>, KeyArgs),
    Query(Arc<Model>, KeyArgs),
    State(Config, StateArgs),
    Serve(Arc<Model>),
    Request(Arc<Model>, request_cli::RequestCommand),
}

impl Prepared {
    /// Read and validate the configuration before anything starts; a bad one exits with 64.
    fn new(command: Command) -> Result<Prepared, ExitCode> {
        Ok(match command {
            Command::Run(c) => Prepared::Run(c.model()?, c.config.clone()),
            Command::Check(c) => Prepared::Check(c.load()?),
            #[cfg(feature = "dev")]
            Command::Demo {
                common,
                rate,
                partitions,
                keys,
                duration,
            } => {
                let mut config = common.load()?;
                // The demo starts its own redis-server unless one is named.
                if common.redis_url.is_none() && std::env::var_os("TALLY_REDIS__URL").is_none() {
                    config.redis.url.clear();
                }
                if common.group_id.is_none() {
                    config.kafka.group_id = "tally-demo".into();
                }
                let opts = demo::DemoOptions {
                    rate,
                    partitions,
                    keys,
                    duration,
                };
                Prepared::Demo(config, opts)
            }
            #[cfg(feature = "dev")]
            Command::MockBroker { topics } => Prepared::MockBroker(topics),
            #[cfg(feature = "dev")]
            Command::Produce(args) => Prepared::Produce(args),
            Command::Key(args) => Prepared::Key(args.common.model()?, args),
            Command::Query(args) => Prepared::Query(args.common.model()?, args),
            Command::State(args) => Prepared::State(args.common.load()?, args),
            Command::Serve(c) => Prepared::Serve(c.model()?),
            Command::Top(args) => Prepared::Top(args),
            Command::Request(r) => Prepared::Request(r.common().model()?, r),
        })
    }

    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        match self {
            Prepared::Run(model, path) => {
                let tally = tally::app::Tally::new(model);
                if let Some(path) = path {
                    tally.metrics.status.set_config_path(&path);
                }
                tally.run(shutdown).await
            }
            Prepared::Top(args) => {
                let urls = if args.urls.is_empty() {
                    vec!["http://127.0.0.1:9100".to_string()]
                } else {
                    args.urls
                };
                let every = args.interval;
                tokio::task::spawn_blocking(move || top::run(urls, args.token, every)).await?
            }
            Prepared::Check(config) => {
                print!("{}", config.to_toml());
                Ok(())
            }
            #[cfg(feature = "dev")]
            Prepared::Demo(config, opts) => demo::run(config, opts, shutdown).await,
            #[cfg(feature = "dev")]
            Prepared::MockBroker(topics) => {
                tally_testkit::produce::mock_broker(&topics, shutdown).await
            }
            #[cfg(feature = "dev")]
            Prepared::Produce(args) => tally_testkit::produce::run(args, shutdown).await,
            Prepared::Key(model, args) => key(model, args, false).await,
            Prepared::Query(model, args) => key(model, args, true).await,
            Prepared::State(config, args) => state(config, args).await,
            Prepared::Serve(model) => tally::app::serve::run(model, shutdown).await,
            Prepared::Request(model, command) => request_cli::run(model, command, shutdown).await,
        }
    }
}

fn main() -> ExitCode {
    // Signals first: a SIGTERM at any moment after this (while the configuration loads, while
    // Redis or Kafka is reached) is a clean shutdown with exit code 0.
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tally: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = CancellationToken::new();
    if let Err(e) = runtime.block_on(async { on_signals(shutdown.clone()) }) {
        eprintln!("tally: cannot listen for signals: {e}");
        return ExitCode::FAILURE;
    }
    // A usage error exits 64 (EX_USAGE), like a bad configuration; --help and --version exit 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = if e.use_stderr() { EXIT_CONFIG as u8 } else { 0 };
            return ExitCode::from(code);
        }
    };
    init_logging();
    let prepared = match Prepared::new(cli.command) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let result = runtime.block_on(prepared.run(shutdown));
    // Whatever still runs (a Kafka client that would not close) must not keep the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally: {e:#}");
            match e.downcast_ref::<request_cli::LockError>() {
                Some(lock) => lock.exit_code(),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// `tally key` (`fetch` false) and `tally query` (`fetch` true).
async fn key(model: Arc<Model>, args: KeyArgs, fetch: bool) -> anyhow::Result<()> {
    let query = tally::query::Query::new(model)?;
    let counter = query.counter_named(args.counter.clone())?;
    let at = tally::query::parse_time(args.at.as_deref())?;
    let dims: std::collections::BTreeMap<String, String> = args.dims.into_iter().collect();
    if fetch && (args.last.is_some() || args.from.is_some() || args.json) {
        use tally::query::{parse_time, Span};
        let span = match (args.last, &args.from, &args.to) {
            (Some(n), _, _) => Span::Last(n),
            (None, Some(a), Some(b)) => Span::Between(parse_time(Some(a))?, parse_time(Some(b))?),
            _ => Span::At(at),
        };
        let now = chrono::Utc::now().timestamp_millis();
        let answer = query.range(&counter, &[dims], span, now).await?.remove(0);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(());
        }
        println!("window_start\twindow_end\tvalue\tkey");
        for w in &answer.windows {
            let value = w.value.map_or("-".to_string(), |v| v.to_string());
            println!("{}\t{}\t{value}\t{}", w.start_ms, w.end_ms, w.key);
        }
        let total = answer.value.map_or("-".to_string(), |v| v.to_string());
        println!("combined\t\t{total}");
        for (member, score) in answer.top.iter().flatten() {
            println!("  {member}\t{score}");
        }
        for note in &answer.notes {
            println!("note: {note}");
        }
        return Ok(());
    }
    if fetch {
        let answer = query.fetch(&counter, &dims, at).await?;
        let value = answer.value.map_or("(none)".to_string(), |v| v.to_string());
        let field = answer.field.map(|f| format!(" {f}")).unwrap_or_default();
        println!("{}{field}\t{value}", answer.key);
        for (member, score) in answer.top.unwrap_or_default() {
            println!("  {member}\t{score}");
        }
    } else {
        let answer = query.key(&counter, &dims, at)?;
        let field = answer.field.map(|f| format!(" {f}")).unwrap_or_default();
        println!("{}{field}", answer.key);
    }
    Ok(())
}

async fn state(config: Config, args: StateArgs) -> anyhow::Result<()> {
    if let Some(StateAction::Repair { partition, offset }) = args.action {
        for (shard, value) in tally::state::repair(&config, partition, offset).await? {
            println!("partition {partition} shard {shard}: applied offset set to {value}");
        }
        return Ok(());
    }
    let rows = tally::state::inspect(&config, &args.partitions).await?;
    println!("partition\tshard\tapplied\tmarker_copy\tstatus");
    for r in rows {
        println!(
            "{}\t{}\t{}\t{}\t{}",
            r.partition,
            r.shard,
            r.fence.as_deref().unwrap_or("-"),
            r.marker_copy.as_deref().unwrap_or("-"),
            r.status()
        );
    }
    Ok(())
}
