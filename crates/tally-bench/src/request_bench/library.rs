//! The library part: each primitive called by `tasks` concurrent tasks for one phase.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use tally::config::{CounterConfig, RedisConfig, RedisMode};
use tally_counters::model::layout::Layout;
use tally_counters::model::CounterSpec;
use tally_counters::request::{
    Algorithm, Batching, Client, Counters, FailureMode, Hit, LimitPolicy, Quota, RateLimiter,
    Unique, MAX_QUOTA_SIZE,
};
use tally_testkit::local_redis::{LocalCluster, LocalRedis};

/// The standalone server's URL, for its CPU figures (`None` on a cluster: no figure).
static STANDALONE_URL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Where the library writes.
pub struct Target {
    config: RedisConfig,
}

impl Target {
    pub fn standalone(redis: &LocalRedis) -> Target {
        Target {
            config: RedisConfig {
                url: redis.url(),
                ..RedisConfig::default()
            },
        }
    }

    pub fn cluster(cluster: &LocalCluster) -> Target {
        Target {
            config: RedisConfig {
                mode: RedisMode::Cluster,
                nodes: cluster.urls(),
                ..RedisConfig::default()
            },
        }
    }
}

fn policy(name: &str, algorithm: Algorithm) -> LimitPolicy {
    LimitPolicy {
        name: name.into(),
        algorithm,
        limit: 100,
        window: Duration::from_secs(1),
        burst: None,
        shadow: false,
        on_redis_error: FailureMode::Open,
        durability: None,
    }
}

/// CPU seconds (user + system) used so far by this process and by the standalone server (read
/// from `INFO cpu`; `None` on a cluster): per decision they are steadier than throughput on a
/// machine shared with other work.
fn cpu_seconds(redis: Option<&mut redis::Connection>) -> (f64, Option<f64>) {
    let own = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // Fields after the command name's closing parenthesis; utime and stime are 14 and 15.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0);
    let server = redis.and_then(|conn| {
        let info: String = redis::cmd("INFO").arg("cpu").query(conn).ok()?;
        Some(
            info.lines()
                .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
                .sum(),
        )
    });
    (own, server)
}

/// One row: ops/s, p50 and p99 (µs) of `call` run by `tasks` tasks for `phase`, and the CPU
/// per decision of this process and of the server.
async fn measure<F, Fut>(label: &str, tasks: usize, phase: Duration, call: F) -> anyhow::Result<()>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let url = STANDALONE_URL.lock().map_or(None, |u| u.clone());
    let mut server = url.and_then(|url| redis::Client::open(url).ok()?.get_connection().ok());
    let cpu_before = cpu_seconds(server.as_mut());
    let start = Instant::now();
    let end = start + phase;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let mut rng = rand::rngs::SmallRng::from_rng(&mut rand::rng());
                while Instant::now() < end {
                    let t = Instant::now();
                    if !call(rng.random_range(0..10_000)).await {
                        errors += 1;
                    }
                    lat.push(t.elapsed().as_micros() as u32);
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (lat, e) = h.await?;
        all.extend(lat);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_after = cpu_seconds(server.as_mut());
    all.sort_unstable();
    let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)));
    let per = |s: f64| format!("{:.1}", s * 1e6 / all.len().max(1) as f64);
    let server_cpu = match (cpu_before.1, cpu_after.1) {
        (Some(a), Some(b)) => per(b - a),
        _ => "-".into(),
    };
    println!(
        "| {label} | {:.0} | {} | {} | {errors} | {} | {server_cpu} |",
        all.len() as f64 / elapsed,
        pct(0.50).copied().unwrap_or(0),
        pct(0.99).copied().unwrap_or(0),
        per(cpu_after.0 - cpu_before.0),
    );
    Ok(())
}

use rand::SeedableRng;

pub async fn run(
    target: &Target,
    tasks: usize,
    phase: Duration,
    batching: Batching,
) -> anyhow::Result<()> {
    let client = Client::new(&target.config)?;
    let mut counter = CounterConfig::reference();
    counter.name = "bench".into();
    counter.dimensions = vec!["subject".into()];
    counter.key = "bench:{subject}:{yyyyMMddHH}".into();
    let counters = Counters::new(
        client.clone(),
        vec![CounterSpec::compile(&counter)?],
        Layout::for_config(&target.config),
    );
    if let Ok(mut url) = STANDALONE_URL.lock() {
        *url = (target.config.mode == RedisMode::Standalone).then(|| target.config.url.clone());
    }
    println!(
        "| primitive | ops/s | p50 µs | p99 µs | errors | bench CPU µs/op | Redis CPU µs/op |"
    );
    println!("|---|---|---|---|---|---|---|");
    let c = counters.clone();
    measure("hit", tasks, phase, move |s| {
        let c = c.clone();
        async move {
            let subject = s.to_string();
            c.hit("bench", &[&subject], &Hit::one()).await.is_ok()
        }
    })
    .await?;
    let c = counters.clone();
    measure("hit + idempotency key", tasks, phase, move |s| {
        let c = c.clone();
        async move {
            let subject = s.to_string();
            let hit = Hit {
                idempotency_key: Some(format!("{:x}", rand::random::<u64>())),
                ..Hit::one()
            };
            c.hit("bench", &[&subject], &hit).await.is_ok()
        }
    })
    .await?;
    // The limit rows side by side: every call alone, then batched (group commit).
    let off = Client::with_batching(&target.config, Batching::OFF)?;
    let on = Client::with_batching(&target.config, batching)?;
    let modes = [
        ("alone", off),
        (
            if batching.max_calls > 1 {
                "batched"
            } else {
                "alone"
            },
            on,
        ),
    ];
    for (mode, client) in &modes {
        let limiter = RateLimiter::new(client.clone(), vec![policy("fixed", Algorithm::Fixed)])?;
        measure(
            &format!("limit: fixed, 1 caller, {mode}"),
            1,
            phase,
            move |s| {
                let limiter = limiter.clone();
                async move { limiter.check(&["fixed"], &s.to_string(), 1).await.is_ok() }
            },
        )
        .await?;
    }
    for (name, algorithm) in [
        ("fixed", Algorithm::Fixed),
        ("sliding_log", Algorithm::SlidingLog),
        ("sliding_counter", Algorithm::SlidingCounter),
        ("gcra", Algorithm::Gcra),
    ] {
        for (mode, client) in &modes {
            let limiter = RateLimiter::new(client.clone(), vec![policy(name, algorithm)])?;
            measure(&format!("limit: {name}, {mode}"), tasks, phase, move |s| {
                let limiter = limiter.clone();
                async move {
                    let subject = s.to_string();
                    limiter.check(&[name], &subject, 1).await.is_ok()
                }
            })
            .await?;
        }
    }
    for (mode, client) in &modes {
        let two = RateLimiter::new(
            client.clone(),
            vec![
                policy("burst", Algorithm::Gcra),
                policy("daily", Algorithm::Fixed),
            ],
        )?;
        let label = format!("limit: gcra + fixed in one call, {mode}");
        measure(&label, tasks, phase, move |s| {
            let two = two.clone();
            async move {
                let subject = s.to_string();
                two.check(&["burst", "daily"], &subject, 1).await.is_ok()
            }
        })
        .await?;
    }
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64)
        + 3_600_000;
    let quota = Quota::new(client.clone(), "bench", MAX_QUOTA_SIZE, false, far);
    measure("quota (one key)", tasks, phase, move |_| {
        let quota = quota.clone();
        async move { quota.take(None).await.is_ok() }
    })
    .await?;
    let unique = Unique::new(client.clone(), "bench", Duration::from_secs(60));
    measure("unique in window", tasks, phase, move |s| {
        let unique = unique.clone();
        async move {
            let item = (s * 7 % 1000).to_string();
            unique.add(&(s % 100).to_string(), &item).await.is_ok()
        }
    })
    .await?;
    Ok(())
}
