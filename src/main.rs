//! The `tally` command line: run, serve, check, key, query, state, version, the request-path calls (hit,
//! limit, quota, once, unique, pool, lock) and, with the `dev` feature (default; the product is
//! built without it), the local tooling on the test kit (demo, mock-broker, produce).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use tally::config::{Config, Model, EXIT_CONFIG};

/// jemalloc, not glibc's malloc: 0.88× the CPU per event on the stream and 0.77–0.92× per
/// decision on the request path, for about 1.1× the memory (docs/lab/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod cli;

use cli::args::{Cli, Command, KeyArgs, StateArgs, TopArgs};
#[cfg(feature = "dev")]
use cli::demo;
use cli::inspect::{key, state};
use cli::request as request_cli;
use cli::top;

/// Report a bad configuration; exit 64 (EX_USAGE) before anything starts.
pub(crate) fn config_error(e: tally::config::ConfigError) -> ExitCode {
    eprintln!("tally: {e}");
    ExitCode::from(EXIT_CONFIG as u8)
}

/// Set for `tally run` and `tally serve`: SIGHUP reloads instead of stopping.
static DAEMON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Cancel `token` on SIGINT or SIGTERM (and SIGHUP, but for `run` and `serve`). The handlers are installed before this returns, so a
/// signal that arrives while the command starts is a clean shutdown, not the default exit.
/// SIGHUP never stops the process (its default would, without a final flush): it asks what is
/// reloadable to reload (`log.level` here; the RLS limits file and the TLS certificate files
/// listen for it too) and is logged.
fn on_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                _ = hup.recv() => {
                    // A terminal hangup ends the other commands (`tally top` whose SSH session
                    // closed), as SIGHUP's default would: a second to stop cleanly, then exit
                    // 129 (a terminal library can spin on the dead terminal and never return).
                    if !DAEMON.load(std::sync::atomic::Ordering::Relaxed) {
                        tracing::info!("SIGHUP: the terminal hung up; stopping");
                        token.cancel();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        std::process::exit(129);
                    }
                    tracing::info!("SIGHUP: reloading what is reloadable (log.level, the rls limits file, the tls certificate files); not stopping");
                    cli::logging::reload();
                }
            }
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
    Check(Arc<Model>),
    #[cfg(feature = "dev")]
    Demo(Box<Config>, demo::DemoOptions),
    #[cfg(feature = "dev")]
    MockBroker(Vec<String>, std::time::Duration),
    #[cfg(feature = "dev")]
    Produce(tally_testkit::produce::ProduceArgs),
    Key(Arc<Model>, KeyArgs),
    Query(Arc<Model>, KeyArgs),
    State(Box<Config>, StateArgs),
    Serve(Arc<Model>),
    Request(Arc<Model>, request_cli::RequestCommand),
    Version,
}

impl Prepared {
    /// Read and validate the configuration before anything starts; a bad one exits with 64.
    fn new(command: Command) -> Result<Prepared, ExitCode> {
        Ok(match command {
            Command::Run(c) => {
                let model = c.model()?;
                cli::logging::follow(&model.config, c.config.clone(), c.overrides());
                DAEMON.store(true, std::sync::atomic::Ordering::Relaxed);
                Prepared::Run(model, c.config.clone())
            }
            // Compiled as `run` and `serve` compile it: the token files and the RLS limits file
            // are read and checked too.
            Command::Check(c) => Prepared::Check(c.model()?),
            #[cfg(feature = "dev")]
            Command::Demo {
                common,
                rate,
                partitions,
                keys,
                duration,
            } => {
                let mut config = common.load()?;
                // The demo starts its own redis-server unless one is named on the command line
                // or in the environment; on the file's loopback port when that is free.
                let mut redis_port = None;
                if common.redis_url.is_none() && std::env::var_os("TALLY_REDIS__URL").is_none() {
                    redis_port = demo::loopback_port(&config.redis.url);
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
                    redis_port,
                };
                Prepared::Demo(Box::new(config), opts)
            }
            #[cfg(feature = "dev")]
            Command::MockBroker {
                topics,
                initial_rebalance_delay,
            } => Prepared::MockBroker(topics, initial_rebalance_delay),
            #[cfg(feature = "dev")]
            Command::Produce(args) => Prepared::Produce(args),
            Command::Key(args) => Prepared::Key(args.common.model()?, args),
            Command::Query(args) => Prepared::Query(args.common.model()?, args),
            Command::State(args) => Prepared::State(Box::new(args.common.load()?), args),
            Command::Serve(c) => {
                let model = c.model()?;
                cli::logging::follow(&model.config, c.config.clone(), c.overrides());
                DAEMON.store(true, std::sync::atomic::Ordering::Relaxed);
                Prepared::Serve(model)
            }
            Command::Top(args) => Prepared::Top(args),
            Command::Request(r) => Prepared::Request(r.common().model()?, r),
            Command::Version => Prepared::Version,
        })
    }

    /// Run the command. `Ok(Err(lock))`: it ran, and the lock it needed (`tally lock`) was not
    /// acquired or was lost, which has an exit code of its own.
    async fn run(
        self,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Result<(), request_cli::LockError>> {
        let done = match self {
            Prepared::Run(model, path) => {
                let tally = tally::app::Tally::new(model);
                if let Some(path) = path {
                    tally.metrics.status.set_config_path(&path);
                }
                tally.run(shutdown).await
            }
            Prepared::Top(args) => {
                let token = args.token()?;
                let tls = args.tls()?;
                let urls = if args.urls.is_empty() {
                    vec!["http://127.0.0.1:9100".to_string()]
                } else {
                    args.urls
                };
                let every = args.interval;
                tokio::task::spawn_blocking(move || top::run(urls, (token, tls), every, shutdown))
                    .await?
            }
            Prepared::Check(model) => {
                print!("{}", model.config.to_toml());
                Ok(())
            }
            #[cfg(feature = "dev")]
            Prepared::Demo(config, opts) => demo::run(*config, opts, shutdown).await,
            #[cfg(feature = "dev")]
            Prepared::MockBroker(topics, delay) => {
                tally_testkit::produce::mock_broker(&topics, delay, shutdown).await
            }
            #[cfg(feature = "dev")]
            Prepared::Produce(args) => tally_testkit::produce::run(args, shutdown).await,
            Prepared::Key(model, args) => key(model, args, false).await,
            Prepared::Query(model, args) => {
                let redis = model.config.redis_target();
                let result = key(model, args, true).await;
                result.with_context(|| format!("redis {redis}"))
            }
            Prepared::State(config, args) => {
                let redis = config.redis_target();
                state(*config, args)
                    .await
                    .with_context(|| format!("redis {redis}"))
            }
            Prepared::Serve(model) => tally::app::serve::run(model, shutdown).await,
            Prepared::Request(model, command) => {
                let redis = model.config.redis_target();
                let result = request_cli::run(model, command, shutdown).await;
                return result.with_context(|| format!("redis {redis}"));
            }
            Prepared::Version => {
                print!("{}", tally::ops::build_info::describe());
                Ok(())
            }
        };
        done.map(Ok)
    }
}

/// An error and its causes on one line, each cause left out when the message before already
/// says it (a Redis error's text repeats its I/O cause: "refused: refused: refused").
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if out.contains(&cause) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&cause);
    }
    out
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
    cli::logging::init();
    let prepared = match Prepared::new(cli.command) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let result = runtime.block_on(prepared.run(shutdown));
    // Whatever still runs (a Kafka client that would not close) must not keep the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(lock)) => {
            eprintln!("tally: {lock}");
            lock.exit_code()
        }
        Err(e) => {
            eprintln!("tally: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}
