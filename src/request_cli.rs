//! `tally serve`, `tally hit`, `tally limit`, `tally quota`, `tally once`: the request path from
//! the command line, for scripts and debugging. Each prints the answer as JSON.

use clap::{Args, Subcommand};
use tally::config::Config;
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
}

impl RequestCommand {
    /// The configuration options of the command.
    pub fn common(&self) -> &Common {
        match self {
            RequestCommand::Hit(a) => &a.common,
            RequestCommand::Limit(a) => &a.common,
            RequestCommand::Quota(a) => &a.common,
            RequestCommand::Once(a) => &a.common,
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

fn parse_action(s: &str) -> Result<Action, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}`: use apply, peek, reset, release or fill"))
}

/// Run one request-path command with a validated configuration.
pub async fn run(config: Config, command: RequestCommand) -> anyhow::Result<()> {
    let requests = Requests::new(&config, Metrics::new(&[]))?;
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
    };
    println!("{answer}");
    Ok(())
}
