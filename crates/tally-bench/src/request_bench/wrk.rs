//! The HTTP part: `tally serve`'s server in this process, `wrk` (a separate process) posting JSON
//! over keep-alive loopback connections, one Lua script per endpoint picking random subjects.

use std::time::Duration;

use tally::config::Config;
use tally_counters::request::{Algorithm, FailureMode, LimitPolicy};
use tally_testkit::local_redis::{free_port, LocalRedis};
use tally_testkit::wrk;
use tokio_util::sync::CancellationToken;

const HIT: &str = r#"
request = function()
  local body = '{"counter":"bench","dimensions":{"subject":"' .. math.random(10000) .. '"}}'
  return wrk.format("POST", "/v1/hit", {["Content-Type"] = "application/json"}, body)
end
"#;

const LIMIT: &str = r#"
request = function()
  local body = '{"policy":"gcra","subject":"' .. math.random(10000) .. '"}'
  return wrk.format("POST", "/v1/limit", {["Content-Type"] = "application/json"}, body)
end
"#;

const QUERY: &str = r#"
request = function()
  return wrk.format("GET", "/v1/counters/bench?window=current&subject=" .. math.random(10000))
end
"#;

const QUOTA: &str = r#"
request = function()
  return wrk.format("POST", "/v1/quota", {["Content-Type"] = "application/json"}, '{"quota":"bench"}')
end
"#;

pub async fn run(redis: &LocalRedis, connections: usize, phase: Duration) -> anyhow::Result<()> {
    let port = free_port()?;
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.http.listen = format!("127.0.0.1:{port}");
    config.http.max_connections = connections * 2;
    config.counters[0].name = "bench".into();
    config.counters[0].dimensions = vec!["subject".into()];
    config.counters[0].key = "bench:{subject}:{yyyyMMddHH}".into();
    config.request.limits.push(LimitPolicy {
        name: "gcra".into(),
        algorithm: Algorithm::Gcra,
        limit: 100,
        window: Duration::from_secs(1),
        burst: None,
        shadow: false,
        on_redis_error: FailureMode::Open,
        durability: None,
    });
    config.request.quotas.push(tally::config::QuotaConfig {
        name: "bench".into(),
        size: u64::MAX / 2,
        once_per_user: false,
        ttl: Duration::from_secs(3600),
        durability: None,
    });
    let model = tally::config::Model::compile(config)?;
    let config_for_batch = model.config.clone();
    let stop = CancellationToken::new();
    let server = tokio::spawn(tally::app::serve::run(model, stop.clone()));
    wait_listening(port).await?;
    println!("| endpoint | requests/s | p50 ms | p99 ms | non-2xx |");
    println!("|---|---|---|---|---|");
    for (label, script, conns) in [
        ("POST /v1/hit", HIT, connections),
        ("POST /v1/limit (gcra)", LIMIT, connections),
        ("POST /v1/quota", QUOTA, connections),
        ("GET /v1/counters/bench (one key)", QUERY, connections),
        ("GET /v1/counters/bench (one key), 8 connections", QUERY, 8),
    ] {
        let path = std::env::temp_dir().join(format!("tally-wrk-{}.lua", std::process::id()));
        std::fs::write(&path, script)?;
        let r = wrk::run(&format!("http://127.0.0.1:{port}"), conns, phase, &path).await?;
        println!(
            "| {label} | {:.0} | {:.2} | {:.2} | {} |",
            r.rps, r.p50_ms, r.p99_ms, r.non_2xx
        );
    }
    batch_queries(&config_for_batch, phase).await?;
    stop.cancel();
    server.await??;
    Ok(())
}

/// The batch queries against a cluster (after the library part wrote its `bench` keys there).
pub async fn batch_on_cluster(
    cluster: &tally_testkit::local_redis::LocalCluster,
    phase: Duration,
) -> anyhow::Result<()> {
    let mut config = Config::default();
    config.redis.mode = tally::config::RedisMode::Cluster;
    config.redis.nodes = cluster.urls();
    config.counters[0].name = "bench".into();
    config.counters[0].dimensions = vec!["subject".into()];
    config.counters[0].key = "bench:{subject}:{yyyyMMddHH}".into();
    batch_queries(&config, phase).await
}

/// `Query::range` for 1,000 dimension tuples at a time (what `POST /v1/counters/{name}/batch`
/// runs): keys read per second.
async fn batch_queries(config: &Config, phase: Duration) -> anyhow::Result<()> {
    let model = tally::config::Model::compile(config.clone())?;
    let client = tally::app::request_client(&model)?;
    let query = std::sync::Arc::new(tally::api::query::Query::new(model, client));
    let tuples: Vec<std::collections::BTreeMap<String, String>> = (0..1000)
        .map(|i| [("subject".to_string(), (i * 7 % 10_000).to_string())].into())
        .collect();
    let tuples = std::sync::Arc::new(tuples);
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (query, tuples) = (query.clone(), tuples.clone());
        tasks.push(tokio::spawn(async move {
            let mut keys = 0u64;
            let mut lat = Vec::new();
            while started.elapsed() < phase {
                let t = std::time::Instant::now();
                let now = chrono::Utc::now().timestamp_millis();
                let answers = query
                    .range("bench", &tuples, tally::api::query::Span::At(now), now)
                    .await
                    .expect("batch query");
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                keys += answers.len() as u64;
            }
            (keys, lat)
        }));
    }
    let mut keys = 0;
    let mut lat = Vec::new();
    for t in tasks {
        let (k, l) = t.await?;
        keys += k;
        lat.extend(l);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "\nBatch queries (`Query::range`, 1,000 tuples per call, 4 concurrent callers): {:.0} keys/s, p50 {:.2} ms, p99 {:.2} ms per call",
        keys as f64 / started.elapsed().as_secs_f64(),
        p(0.5),
        p(0.99)
    );
    Ok(())
}

async fn wait_listening(port: u16) -> anyhow::Result<()> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!("tally serve did not listen on {port}")
}
