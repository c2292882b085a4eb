//! tally's own time per decision, from its histograms (`tally_rls_duration_seconds` for
//! gRPC, `tally_request_duration_seconds{primitive="limit"}` for HTTP): from the decoded call
//! to the built answer, the Redis round trip included; not the bytes on the wire, HTTP/2 and
//! the wait for a worker. Beside the client's figures it shows how much of the tail is the
//! decision and how much the queueing of three processes on two cores.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Cumulative bucket counts, `(upper bound in seconds, count)`, in the exposition's order.
#[derive(Clone, Default)]
pub struct Buckets(Vec<(f64, u64)>);

/// Which histogram.
#[derive(Clone, Copy)]
pub enum Which {
    Rls,
    HttpLimit,
}

/// The histogram's buckets now, from `GET /metrics` on `port` (empty when unreachable).
pub async fn read(port: u16, which: Which) -> Buckets {
    let Ok(text) = get_metrics(port).await else {
        return Buckets::default();
    };
    let (prefix, filter) = match which {
        Which::Rls => ("tally_rls_duration_seconds_bucket{", ""),
        Which::HttpLimit => (
            "tally_request_duration_seconds_bucket{",
            "primitive=\"limit\"",
        ),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        if !labels.contains(filter) {
            continue;
        }
        let le = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("le=\""))
            .and_then(|v| v.strip_suffix('"'));
        let le = match le {
            Some("+Inf") => f64::INFINITY,
            Some(v) => v.parse().unwrap_or(f64::NAN),
            None => continue,
        };
        out.push((le, count.trim().parse().unwrap_or(0)));
    }
    Buckets(out)
}

impl Buckets {
    /// The `q` quantile in milliseconds of what was observed since `before` (linear within
    /// the bucket, as Prometheus' `histogram_quantile`; the buckets double from 0.1 ms, so
    /// this is an estimate).
    pub fn quantile_ms_since(&self, before: &Buckets, q: f64) -> Option<f64> {
        let counts: Vec<(f64, u64)> = self
            .0
            .iter()
            .map(|&(le, n)| {
                let was = before.0.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
                (le, n.saturating_sub(was))
            })
            .collect();
        let total = counts.last()?.1;
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut lower = (0.0, 0u64);
        for &(le, n) in &counts {
            if n as f64 >= rank {
                if le.is_infinite() {
                    return Some(lower.0 * 1000.0);
                }
                let inside = (n - lower.1) as f64;
                let frac = if inside > 0.0 {
                    (rank - lower.1 as f64) / inside
                } else {
                    1.0
                };
                return Some((lower.0 + (le - lower.0) * frac) * 1000.0);
            }
            lower = (le, n);
        }
        None
    }
}

async fn get_metrics(port: u16) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
