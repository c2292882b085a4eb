//! `tally serve`, `tally hit`, `tally limit`, `tally quota`, `tally once`: the request path from
//! the command line, for scripts and debugging. Each prints the answer as JSON.

use clap::{Args, Subcommand};
use std::sync::Arc;

use tally::config::{Config, Model};
use tally::metrics::Metrics;
use tally::request::{Action, Requests};
use tally_counters::request::Hit;

use super::{parse_dim, Common};

/// The request-path commands.
#[derive(Subcommand)]
pub enum RequestCommand {
    /// Add to a counter now (or at --at) and print the total.
    Hit(HitArgs),
    /// Decide a request against rate-limit policies.
    Limit(LimitArgs),
    /// Take from (or release, peek, reset) a quota.
    Quota(QuotaArgs),
    /// Is this the subject's first call in the window?
    Once(OnceArgs),
    /// Take a lock, hold it (renewed by a watchdog) and release it; or release / extend one.
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
    /// How long to hold it once taken (until Ctrl-C or the lease is lost otherwise).
    #[arg(long, value_parser = humantime::parse_duration)]
    hold: Option<std::time::Duration>,
    /// Release the lease with this token instead of acquiring.
    #[arg(long, conflicts_with = "extend_token")]
    release_token: Option<String>,
    /// Extend the lease with this token (to --ttl from now) instead of acquiring.
    #[arg(long)]
    extend_token: Option<String>,
}

/// `tally lock`: each step is printed as one JSON line as it happens.
async fn lock(config: &Config, a: LockArgs) -> anyhow::Result<()> {
    use tally_counters::lock::{Lease, Locks};
    let locks = Locks::new(tally_counters::request::Client::new(&config.redis)?);
    if let Some(token) = &a.release_token {
        let released = locks.release(&Lease::known(&locks, &a.name, token)).await?;
        println!("{}", serde_json::json!({ "released": released }));
        return Ok(());
    }
    if let Some(token) = &a.extend_token {
        let extended = locks
            .extend(&Lease::known(&locks, &a.name, token), a.ttl)
            .await?;
        println!("{}", serde_json::json!({ "extended": extended }));
        return Ok(());
    }
    let lease = match locks.acquire(&a.name, a.ttl, a.wait).await? {
        Ok(lease) => lease,
        Err(busy) => {
            println!(
                "{}",
                serde_json::json!({ "acquired": false, "held_for_ms": busy.held_for_ms })
            );
            return Ok(());
        }
    };
    println!(
        "{}",
        serde_json::json!({ "acquired": true, "fence": lease.fence, "token": lease.token })
    );
    let Some(hold) = a.hold else { return Ok(()) };
    let mut guard = locks.guard(lease, None);
    let lost = tokio::select! {
        _ = tokio::time::sleep(hold) => false,
        _ = guard.lost() => true,
    };
    if lost {
        println!("{}", serde_json::json!({ "lost": true }));
    }
    let released = guard.release().await?;
    println!("{}", serde_json::json!({ "released": released }));
    Ok(())
}

fn parse_action(s: &str) -> Result<Action, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}`: use apply, peek, reset, release or fill"))
}

/// Run one request-path command with a validated configuration.
pub async fn run(model: Arc<Model>, command: RequestCommand) -> anyhow::Result<()> {
    let requests = Requests::new(&model, Metrics::new(&[]))?;
    let answer = match command {
        RequestCommand::Hit(a) => {
            let at_ms = match &a.at {
                Some(_) => Some(tally::query::parse_time(a.at.as_deref())?),
                None => None,
            };
            let hit = Hit {
                delta: a.value,
                at_ms,
                idempotency_key: a.idempotency_key,
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
        RequestCommand::Lock(a) => return lock(&model.config, a).await,
    };
    println!("{answer}");
    Ok(())
}
