//! Part 3: `wrk` → Envoy → a trivial upstream, with and without Envoy's rate-limit filter
//! calling tally's RLS: requests/s, p50/p99 and the filter's cost as ratios.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_testkit::local_redis::free_port;
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
        ("without the rate-limit filter", false),
        ("with the rate-limit filter (tally RLS)", true),
    ] {
        let envoy = Envoy::start(s, app, filter)?;
        // Warm up: Envoy's connections to the upstream and to the RLS.
        wrk(envoy.port, 8, Duration::from_secs(1), &script).await?;
        let r = wrk(envoy.port, s.connections, s.phase, &script).await?;
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

struct Envoy {
    child: Child,
    port: u16,
}

impl Envoy {
    fn start(s: &Setup, app: u16, filter: bool) -> anyhow::Result<Envoy> {
        let (port, admin) = (free_port()?, free_port()?);
        let name = if filter { "with" } else { "without" };
        let config = s.dir.join(format!("envoy-{name}.yaml"));
        std::fs::write(&config, envoy_yaml(port, admin, app, s.rls, filter))?;
        let log = s.dir.join(format!("envoy-{name}.log"));
        let child = Command::new(std::env::var("TALLY_ENVOY").unwrap_or_else(|_| "envoy".into()))
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", &s.concurrency.to_string()])
            .args(["--disable-hot-restart", "-l", "warning", "--log-path"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let envoy = Envoy { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while tally_testkit::http::get(admin, "/ready").is_none_or(|(code, _)| code != 200) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "envoy not ready: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(envoy)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The listener → `app` route, with (`filter`) the rate-limit filter: domain `bench`, one
/// descriptor from `x-user`, tally's RLS as its gRPC cluster, Envoy's default 20 ms timeout.
fn envoy_yaml(port: u16, admin: u16, app: u16, rls: u16, filter: bool) -> String {
    let endpoint = |p: u16| {
        format!(
            "endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: \
             {{address: 127.0.0.1, port_value: {p}}}}}}}}}]}}]"
        )
    };
    let rate_limit_filter = if filter {
        r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: rls}}
"#
    } else {
        ""
    };
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: edge
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: app
                  rate_limits:
                  - actions: [{{request_headers: {{header_name: x-user, descriptor_key: user}}}}]
          http_filters:
{rate_limit_filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: app
    type: STATIC
    load_assignment: {{cluster_name: app, {app_ep}}}
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment: {{cluster_name: rls, {rls_ep}}}
"#,
        app_ep = endpoint(app),
        rls_ep = endpoint(rls),
    )
}

/// What `wrk --latency` printed.
struct Wrk {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    non_2xx: u64,
}

async fn wrk(
    port: u16,
    connections: usize,
    phase: Duration,
    script: &std::path::Path,
) -> anyhow::Result<Wrk> {
    let out = tokio::process::Command::new("wrk")
        .args(["-t", "1", "-c", &connections.to_string()])
        .args(["-d", &format!("{}s", phase.as_secs().max(1))])
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).ok_or_else(|| anyhow::anyhow!("wrk said: {text}"))
}

fn parse(text: &str) -> Option<Wrk> {
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_string()))
    };
    let ms = |v: String| -> Option<f64> {
        if let Some(x) = v.strip_suffix("us") {
            x.parse::<f64>().ok().map(|x| x / 1000.0)
        } else if let Some(x) = v.strip_suffix("ms") {
            x.parse().ok()
        } else {
            v.strip_suffix('s')?.parse::<f64>().ok().map(|x| x * 1000.0)
        }
    };
    Some(Wrk {
        rps: field("Requests/sec:")?.parse().ok()?,
        p50_ms: ms(field("50%")?)?,
        p99_ms: ms(field("99%")?)?,
        non_2xx: field("Non-2xx or 3xx responses:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    })
}
