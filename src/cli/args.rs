//! The command line's arguments: the commands, and the options they share.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub(crate) use super::common::{parse_dim, Common};
use super::request as request_cli;

#[derive(Parser)]
#[command(
    name = "tally",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TALLY_BUILD_COMMIT"), ")"),
    about = "Exact, time-windowed counters in Redis, three ways: from a Kafka stream (`tally run`), \
             on the request path over HTTP (`tally serve`: hits, rate limits, quotas, once, \
             locks), and as Envoy's rate limit service (`tally serve` with `[rls]`)"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Consume the configured topic and maintain the counters (the service).
    #[command(after_help = "Example:\n  tally run --config config/example.toml")]
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
    #[command(after_help = "Example:\n  tally check --config config/example.toml")]
    Check(Common),
    /// Run an in-process Kafka-protocol broker (librdkafka mock cluster) for tests and benchmarks.
    #[cfg(feature = "dev")]
    #[command(after_help = "Example:\n  tally mock-broker --topic events:8")]
    MockBroker {
        /// Topics to create, as name:partitions.
        #[arg(long = "topic", default_value = "events:8")]
        topics: Vec<String>,
        /// How long a new consumer group waits for more members before its first rebalance
        /// (Kafka's group.initial.rebalance.delay.ms). The mock drops a member whose join waits
        /// longer than its session.timeout.ms: keep it below the consumers' session timeout.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        initial_rebalance_delay: Duration,
    },
    /// Produce synthetic JSON events to a topic at a target rate (load generator).
    #[cfg(feature = "dev")]
    #[command(
        after_help = "Example:\n  tally produce --brokers 127.0.0.1:9092 --topic events --rate 10000"
    )]
    Produce(tally_testkit::produce::ProduceArgs),
    /// Print the Redis key of a counter for given dimension values (and time).
    #[command(
        after_help = "Example:\n  tally key --config config/example.toml --counter flow --dim app_id=a1 --dim device_id=d1 --dim ip=10.0.0.1"
    )]
    Key(KeyArgs),
    /// Print a counter's key and current value, read from Redis.
    #[command(
        after_help = "Example:\n  tally query --config config/example.toml --counter minute --dim ip=10.0.0.1 --last 60"
    )]
    Query(KeyArgs),
    /// Inspect (and with `repair`, fix) tally's own state in Redis: applied offsets per partition.
    #[command(
        after_help = "Example:\n  tally state --config config/example.toml; tally state --config config/example.toml repair --partition 3"
    )]
    State(StateArgs),
    /// The live status of one or several tally processes in the terminal (their `/v1/status`).
    #[command(
        after_help = "Example:\n  TALLY_TOKEN=\"$TOKEN\" tally top http://10.0.0.1:9100 http://10.0.0.2:9100\n  Keys: q, Esc or Ctrl-C quits."
    )]
    Top(TopArgs),
    /// Serve the request path (hit, limit, quota, once, unique, pool) over HTTP, without Kafka.
    #[command(after_help = "Example:\n  tally serve --config config/example.toml")]
    Serve(Common),
    #[command(flatten)]
    Request(request_cli::RequestCommand),
    /// Print the version, the git commit and the build profile (as `tally_build_info` exports).
    #[command(after_help = "Example:\n  tally version")]
    Version,
}

impl TopArgs {
    /// The token: from `--token-file`, else from `TALLY_TOKEN`.
    /// The TLS settings for https:// URLs, the files read now (a bad one is an error before
    /// the screen is drawn).
    pub(crate) fn tls(&self) -> anyhow::Result<ureq::tls::TlsConfig> {
        use ureq::tls::{parse_pem, ClientCert, PemItem, RootCerts, TlsConfig};
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
        };
        let certs = |flag: &str, path: &std::path::Path| -> anyhow::Result<Vec<_>> {
            let pem = read(flag, path)?;
            let certs: Vec<_> = parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            anyhow::ensure!(
                !certs.is_empty(),
                "{flag} {}: no PEM certificate",
                path.display()
            );
            Ok(certs)
        };
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &self.ca_file {
            tls = tls.root_certs(RootCerts::new_with_certs(&certs("--ca-file", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            let chain = certs("--cert-file", cert)?;
            let key = ureq::tls::PrivateKey::from_pem(&read("--key-file", key)?)
                .map_err(|e| anyhow::anyhow!("--key-file {}: {e}", key.display()))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        Ok(tls.build())
    }

    pub(crate) fn token(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", path.display()))?;
            return Ok(Some(text.trim().to_string()).filter(|t| !t.is_empty()));
        }
        Ok(std::env::var("TALLY_TOKEN").ok().filter(|t| !t.is_empty()))
    }
}

/// `tally top [URL…]`.
#[derive(Args)]
pub(crate) struct TopArgs {
    /// Base URLs of tally processes (default: http://127.0.0.1:9100).
    pub(crate) urls: Vec<String>,
    /// File holding the bearer token, when the processes set `http.token` (or set the
    /// environment variable TALLY_TOKEN). Not a flag's value: a command line is visible to
    /// every user of the host (`ps`).
    #[arg(long)]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// Time between two refreshes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) interval: Duration,
    /// https:// URLs: PEM file of the CA that signed the processes' certificates (`[http.tls]`);
    /// default: the public web roots.
    #[arg(long)]
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// https:// URLs with mutual TLS (`http.tls.client_ca_file`): this client's PEM certificate
    /// (with `--key-file`).
    #[arg(long, requires = "key_file")]
    pub(crate) cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of `--cert-file`.
    #[arg(long, requires = "cert_file")]
    pub(crate) key_file: Option<std::path::PathBuf>,
}

/// `tally state [repair --partition P [--offset N]]`.
#[derive(Args)]
pub(crate) struct StateArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Also show these partitions (comma separated) even if Redis has nothing for them.
    #[arg(long, value_delimiter = ',')]
    pub(crate) partitions: Vec<i32>,
    #[command(subcommand)]
    pub(crate) action: Option<StateAction>,
}

#[derive(Subcommand)]
pub(crate) enum StateAction {
    /// Set a halted partition's applied offset on every shard: to --offset, or to the state
    /// marker's copy (exact when only the offset key was lost).
    Repair {
        /// The topic of the partition (needed when several topics are read).
        #[arg(long = "topic")]
        topic_name: Option<String>,
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
pub(crate) struct KeyArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Counter name, e.g. flow (may be left out when only one counter is configured).
    #[arg(long)]
    pub(crate) counter: Option<String>,
    /// A dimension value as name=value; repeat for each dimension.
    #[arg(long = "dim", value_parser = parse_dim)]
    pub(crate) dims: Vec<(String, String)>,
    /// The time whose window to read: RFC 3339 or epoch ms (default: now).
    #[arg(long)]
    pub(crate) at: Option<String>,
    /// `tally query`: the last N windows up to now, per window and combined.
    #[arg(long, conflicts_with_all = ["at", "from"])]
    pub(crate) last: Option<usize>,
    /// `tally query`: every window from this time (with --to).
    #[arg(long, requires = "to", conflicts_with = "at")]
    pub(crate) from: Option<String>,
    /// `tally query`: ... to this time.
    #[arg(long, requires = "from")]
    pub(crate) to: Option<String>,
    /// `tally query`: print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// `tally query`: leaderboards list this many best members.
    #[arg(long, default_value_t = 10)]
    pub(crate) top: usize,
}
