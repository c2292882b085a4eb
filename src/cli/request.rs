//! `tally serve`, `tally hit`, `tally limit`, `tally quota`, `tally once`: the request path from
//! the command line, for scripts and debugging. Each prints the answer as JSON.
//!
//! Exit codes: 0 done, 1 error (Redis unreachable, a refused request), 64 bad command line or
//! configuration (EX_USAGE); `tally lock` adds [`LockError`]'s codes so that a script can tell "someone
//! else has it" and "I lost it" from a failure.

use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use tally::api::primitives::{Action, Primitives};
use tally::config::{Config, Model};
use tally::ops::metrics::Metrics;
use tally_counters::request::Hit;

use super::common::{parse_dim, Common};

/// The request-path commands.
#[derive(Subcommand)]
pub enum RequestCommand {
    /// Add to a counter now (or at --at) and print the total.
    #[command(
        after_help = "Example:\n  tally hit --config config/example.toml --counter flow --dim app_id=a --dim device_id=d --dim ip=1.2.3.4 --idempotency-key req-1"
    )]
    Hit(HitArgs),
    /// Decide a request against rate-limit policies.
    #[command(
        after_help = "Example:\n  tally limit --config config/example.toml --policy per_second --policy daily --subject ip:1.2.3.4"
    )]
    Limit(LimitArgs),
    /// Take from (or release, peek, reset) a quota.
    #[command(
        after_help = "Example:\n  tally quota --config config/example.toml --quota flash --user u42 --action release"
    )]
    Quota(QuotaArgs),
    /// Is this the subject's first call in the window?
    #[command(
        after_help = "Example:\n  tally once --config config/example.toml --name welcome --subject user:42"
    )]
    Once(OnceArgs),
    /// Take a lock, hold it (renewed by a watchdog) and release it; or release / extend one.
    #[command(after_help = LOCK_HELP)]
    Lock(LockArgs),
}

impl RequestCommand {
    /// The configuration options of the command.
    pub fn common(&self) -> &Common {
        match self {
            RequestCommand::Hit(a) => &a.common,
            RequestCommand::Limit(a) => &a.common,
            RequestCommand::Quota(a) => &a.common,
            RequestCommand::Once(a) => &a.common,
            RequestCommand::Lock(a) => &a.common,
        }
    }
}

#[derive(Args)]
pub struct HitArgs {
    #[command(flatten)]
    common: Common,
    /// Counter name.
    #[arg(long)]
    counter: String,
    /// A dimension value as name=value; repeat for each dimension.
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, String)>,
    /// Amount to add.
    #[arg(long, default_value_t = 1)]
    value: i64,
    /// Time of the hit (RFC 3339 or epoch ms; default now).
    #[arg(long)]
    at: Option<String>,
    /// A retried hit with the same key counts once.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// apply (default), peek or reset.
    #[arg(long, default_value = "apply", value_parser = parse_action)]
    action: Action,
}

#[derive(Args)]
pub struct LimitArgs {
    #[command(flatten)]
    common: Common,
    /// Policy name; repeat to decide several policies at once.
    #[arg(long = "policy", required = true)]
    policies: Vec<String>,
    /// Who is limited (user, IP, API key).
    #[arg(long)]
    subject: String,
    /// Units this request costs.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// apply (default), peek or reset.
    #[arg(long, default_value = "apply", value_parser = parse_action)]
    action: Action,
}

#[derive(Args)]
pub struct QuotaArgs {
    #[command(flatten)]
    common: Common,
    /// Quota name.
    #[arg(long)]
    quota: String,
    /// The user (once-per-user quotas).
    #[arg(long)]
    user: Option<String>,
    /// apply (default: take), release, peek or reset.
    #[arg(long, default_value = "apply", value_parser = parse_action)]
    action: Action,
}

#[derive(Args)]
pub struct OnceArgs {
    #[command(flatten)]
    common: Common,
    /// Once family name.
    #[arg(long)]
    name: String,
    /// Who.
    #[arg(long)]
    subject: String,
    /// apply (default), peek or reset.
    #[arg(long, default_value = "apply", value_parser = parse_action)]
    action: Action,
}

#[derive(Args)]
pub struct LockArgs {
    #[command(flatten)]
    common: Common,
    /// Lock name.
    #[arg(long)]
    name: String,
    /// Lease length (renewed every third of it while held).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: std::time::Duration,
    /// How long to wait for the lock.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    wait: std::time::Duration,
    /// How long to hold it once taken, renewed, then release it (ends early on Ctrl-C or
    /// SIGTERM, which release it too, or when the lease is lost).
    #[arg(long, value_parser = humantime::parse_duration)]
    hold: Option<std::time::Duration>,
    /// Release the lease with this token instead of acquiring.
    #[arg(long, conflicts_with = "extend_token")]
    release_token: Option<String>,
    /// Extend the lease with this token (to --ttl from now) instead of acquiring.
    #[arg(long)]
    extend_token: Option<String>,
}

/// Shown under `tally lock --help`.
const LOCK_HELP: &str = "\
Examples:
  # Run a job only if no one else runs it; the lease ends after --ttl (or release its token):
  tally lock --config config/example.toml --name nightly --ttl 10m && ./nightly-job
  # Hold the lock, renewed every ttl/3, for up to 10m or until Ctrl-C / SIGTERM, then release:
  tally lock --config config/example.toml --name nightly --ttl 30s --wait 2s --hold 10m

Exit codes:
  0   done: acquired (with --hold: held, then released at its end or on SIGINT/SIGTERM),
      released, or extended
  1   error (Redis unreachable, an invalid ttl)
  64  bad command line or configuration
  69  lost: the lease ran out or was taken over while held (--hold), or --extend-token found
      it no longer held
  75  not acquired: another holder has the lock (until --wait ran out); try again later";

/// The answers of `tally lock` that are not errors of tally but that a script must act on;
/// each has its own exit code (sysexits.h), listed under `tally lock --help`.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else holds the lock (or a signal ended the wait): the job must not run.
    #[error("lock `{0}` not acquired: another holder has it")]
    NotAcquired(String),
    /// The lease ended while held: another process may hold the lock and act now.
    #[error("lock `{0}` lost while held")]
    Lost(String),
}

impl LockError {
    /// EX_TEMPFAIL: a later try may succeed.
    pub const NOT_ACQUIRED: u8 = 75;
    /// EX_UNAVAILABLE: the lock this process relied on is gone.
    pub const LOST: u8 = 69;

    /// The process exit code for this answer.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            LockError::NotAcquired(_) => Self::NOT_ACQUIRED,
            LockError::Lost(_) => Self::LOST,
        })
    }
}

/// `tally lock`: each step is printed as one JSON line as it happens.
/// `Ok(Err(_))`: the lock was not acquired, or was lost while held.
async fn lock(
    config: &Config,
    a: LockArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Result<(), LockError>> {
    use tally_counters::lock::{Lease, Locks};
    let locks = Locks::new(tally_counters::request::Client::new(&config.redis)?);
    if let Some(token) = &a.release_token {
        let released = locks.release(&Lease::known(&locks, &a.name, token)).await?;
        println!("{}", serde_json::json!({ "released": released }));
        return Ok(Ok(()));
    }
    if let Some(token) = &a.extend_token {
        let extended = locks
            .extend(&Lease::known(&locks, &a.name, token), a.ttl)
            .await?;
        println!("{}", serde_json::json!({ "extended": extended }));
        return Ok(match extended {
            true => Ok(()),
            false => Err(LockError::Lost(a.name)),
        });
    }
    // A signal ends the wait. An attempt cut off in flight may still have taken the lock;
    // nobody knows its token then, and it runs out after --ttl.
    let acquired = tokio::select! {
        acquired = locks.acquire(&a.name, a.ttl, a.wait) => acquired?,
        _ = shutdown.cancelled() => {
            println!("{}", serde_json::json!({ "acquired": false }));
            return Ok(Err(LockError::NotAcquired(a.name)));
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(busy) => {
            println!(
                "{}",
                serde_json::json!({ "acquired": false, "held_for_ms": busy.held_for_ms })
            );
            return Ok(Err(LockError::NotAcquired(a.name)));
        }
    };
    println!(
        "{}",
        serde_json::json!({ "acquired": true, "fence": lease.fence, "token": lease.token })
    );
    let Some(hold) = a.hold else {
        return Ok(Ok(()));
    };
    let mut guard = locks.guard(lease, None);
    // --hold running out and a signal are both the normal end of a hold.
    let lost = tokio::select! {
        _ = tokio::time::sleep(hold) => false,
        _ = shutdown.cancelled() => false,
        _ = guard.lost() => true,
    };
    if lost {
        println!("{}", serde_json::json!({ "lost": true }));
        // Best effort: the lease is gone, and its release deletes nothing of a new holder's.
        if let Ok(released) = guard.release().await {
            println!("{}", serde_json::json!({ "released": released }));
        }
        return Ok(Err(LockError::Lost(a.name)));
    }
    let released = guard.release().await?;
    println!("{}", serde_json::json!({ "released": released }));
    Ok(Ok(()))
}

fn parse_action(s: &str) -> Result<Action, super::common::ArgError> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| super::common::ArgError::UnknownAction(s.to_string()))
}

/// Run one request-path command with a validated configuration; `shutdown` (SIGINT, SIGTERM)
/// ends `tally lock`'s wait and hold.
pub async fn run(
    model: Arc<Model>,
    command: RequestCommand,
    shutdown: CancellationToken,
) -> anyhow::Result<Result<(), LockError>> {
    let requests = Primitives::new(
        &model,
        tally::app::request_client(&model)?,
        Metrics::new(&[]),
    )?;
    let answer = match command {
        RequestCommand::Hit(a) => {
            let at_ms = match &a.at {
                Some(_) => Some(tally::api::query::parse_time(a.at.as_deref())?),
                None => None,
            };
            let hit = Hit {
                delta: a.value,
                at_ms,
                idempotency_key: a.idempotency_key,
                // The CLI talks to Redis itself: it has every scope.
                max_value: None,
            };
            let dims = a.dims.into_iter().collect();
            serde_json::to_value(requests.hit(&a.counter, &dims, &hit, a.action).await?)?
        }
        RequestCommand::Limit(a) => {
            let names: Vec<&str> = a.policies.iter().map(String::as_str).collect();
            let d = requests.limit(&names, &a.subject, a.cost, a.action).await?;
            serde_json::to_value(d)?
        }
        RequestCommand::Quota(a) => serde_json::to_value(
            requests
                .quota(&a.quota, a.user.as_deref(), a.action)
                .await?,
        )?,
        RequestCommand::Once(a) => {
            serde_json::to_value(requests.once(&a.name, &a.subject, None, a.action).await?)?
        }
        RequestCommand::Lock(a) => return lock(&model.config, a, &shutdown).await,
    };
    println!("{answer}");
    Ok(Ok(()))
}
