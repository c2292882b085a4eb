//! `wrk --latency` (Debian's `wrk`, installed by scripts/setup.sh) against a loopback URL, and
//! what it printed read back: requests/s, p50/p99 and the non-2xx count.

use std::path::Path;
use std::time::Duration;

/// What `wrk --latency` printed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wrk {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub non_2xx: u64,
}

/// One thread and `connections` connections for `phase` (whole seconds, at least 1) running
/// the Lua `script` against `url`.
pub async fn run(
    url: &str,
    connections: usize,
    phase: Duration,
    script: &Path,
) -> anyhow::Result<Wrk> {
    let out = tokio::process::Command::new("wrk")
        .args(["-t", "1", "-c", &connections.to_string()])
        .args(["-d", &format!("{}s", phase.as_secs().max(1))])
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).ok_or_else(|| anyhow::anyhow!("wrk said: {text}"))
}

/// The figures of `wrk --latency`'s report.
pub fn parse(text: &str) -> Option<Wrk> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rates_latencies_in_every_unit_and_errors() {
        let text = "Running 4s test @ http://127.0.0.1:1/
  1 threads and 64 connections
  Latency Distribution
     50%  812.00us
     75%    1.20ms
     90%    1.90ms
     99%    2.87ms
  160000 requests in 4.00s, 20.00MB read
  Non-2xx or 3xx responses: 12
Requests/sec:  39713.25
";
        let w = parse(text).unwrap();
        assert_eq!(w.rps, 39713.25);
        assert!((w.p50_ms - 0.812).abs() < 1e-9);
        assert_eq!(w.p99_ms, 2.87);
        assert_eq!(w.non_2xx, 12);
        let slow = text.replace("2.87ms", "1.50s");
        assert_eq!(parse(&slow).unwrap().p99_ms, 1500.0);
        assert!(parse("wrk: connection refused").is_none());
    }
}
