//! Part 3: `wrk` → Envoy → a trivial upstream, with and without Envoy's rate-limit filter
//! calling tally's RLS, and with the rate limit quota filter (tally's RLQS: decided in Envoy,
//! usage reported every 5 s, Envoy 1.40's fixed interval): requests/s, p50/p99 and each
//! filter's cost as ratios.

use std::path::PathBuf;
use std::time::Duration;

use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitFilter, RateLimitQuotaFilter};
use tally_testkit::wrk;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What part 3 needs.
pub struct Setup {
    pub rls: u16,
    pub dir: PathBuf,
    pub connections: usize,
    pub concurrency: usize,
    pub phase: Duration,
}

const SCRIPT: &str = r#"
request = function()
  return wrk.format("GET", "/", {["x-user"] = tostring(math.random(10000))})
end
"#;

pub async fn run(s: &Setup) -> anyhow::Result<()> {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app = upstream.local_addr()?.port();
    let serving = tokio::spawn(trivial_upstream(upstream));
    let script = s.dir.join("envoy.lua");
    std::fs::write(&script, SCRIPT)?;
    println!(
        "\n## Through Envoy (`wrk -c {}` → Envoy --concurrency {} → a fixed 200)\n",
        s.connections, s.concurrency
    );
    println!("| Envoy | requests/s | p50 ms | p99 ms | non-2xx |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (label, filter) in [
        ("without the rate-limit filter", Filter::None),
        ("with the rate-limit filter (tally RLS)", Filter::Rls),
        (
            "with the rate limit quota filter (tally RLQS)",
            Filter::Rlqs,
        ),
    ] {
        let envoy = start_envoy(s, app, filter)?;
        let url = format!("http://127.0.0.1:{}/", envoy.port);
        // Warm up: Envoy's connections to the upstream and to the RLS; for the quota filter,
        // past its first report (every 5 s), which measures the demand its grants cover.
        let warm = if filter == Filter::Rlqs { 6 } else { 1 };
        wrk::run(&url, 8, Duration::from_secs(warm), &script).await?;
        let r = wrk::run(&url, s.connections, s.phase, &script).await?;
        println!(
            "| {label} | {:.0} | {:.2} | {:.2} | {} |",
            r.rps, r.p50_ms, r.p99_ms, r.non_2xx
        );
        rows.push(r);
    }
    println!(
        "\nThe filter's cost: requests/s {:.2}× (with ÷ without), p50 {:.2}×, p99 {:.2}×",
        rows[1].rps / rows[0].rps.max(1e-9),
        rows[1].p50_ms / rows[0].p50_ms.max(1e-9),
        rows[1].p99_ms / rows[0].p99_ms.max(1e-9)
    );
    println!(
        "The quota filter's cost: requests/s {:.2}× (with ÷ without), p50 {:.2}×, p99 {:.2}×",
        rows[2].rps / rows[0].rps.max(1e-9),
        rows[2].p50_ms / rows[0].p50_ms.max(1e-9),
        rows[2].p99_ms / rows[0].p99_ms.max(1e-9)
    );
    serving.abort();
    Ok(())
}

/// Answers every HTTP/1.1 request (no body: GETs from Envoy) with a fixed 200, keep-alive.
async fn trivial_upstream(listener: tokio::net::TcpListener) {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";
    while let Ok((mut conn, _)) = listener.accept().await {
        tokio::spawn(async move {
            let _ = conn.set_nodelay(true);
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Ok(n) = conn.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    if conn.write_all(OK).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// Which filter Envoy runs before the router.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Filter {
    None,
    /// The rate-limit filter: a call to tally's RLS per request.
    Rls,
    /// The rate limit quota filter: decided locally, usage reported to tally every 5 s
    /// (Envoy 1.40's fixed interval). Its first assignment covers a few requests until the first
    /// report measures the demand: the row is meaningful after a warm-up of 5 s.
    Rlqs,
}

/// Envoy on `app` with `filter`: the rate-limit filter (domain `bench`, one descriptor from
/// `x-user`, tally's RLS as its gRPC cluster, Envoy's default 20 ms timeout), or the quota
/// filter (domain `bench`, one bucket whose limit nothing reaches).
fn start_envoy(s: &Setup, app: u16, filter: Filter) -> anyhow::Result<Envoy> {
    let route = [
        "route:",
        "  cluster: app",
        "  rate_limits:",
        "  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]",
    ];
    let bootstrap = Bootstrap {
        app,
        rls: s.rls,
        route: &route,
        rate_limit: (filter == Filter::Rls).then_some(RateLimitFilter {
            domain: "bench",
            failure_mode_deny: true,
            settings: &[],
            token: None,
        }),
        rls_tls: None,
    };
    let quota = match filter {
        Filter::Rlqs => RateLimitQuotaFilter {
            domain: "bench",
            bucket_id: &[("name", "bench")],
            reporting_interval_s: 5,
            behaviors: &[],
            token: None,
        }
        .yaml(),
        _ => String::new(),
    };
    let name = match filter {
        Filter::None => "without",
        Filter::Rls => "with",
        Filter::Rlqs => "with-quota",
    };
    Envoy::start(&s.dir, name, s.concurrency, |port, admin| {
        bootstrap.yaml_with(port, admin, &quota)
    })
}
