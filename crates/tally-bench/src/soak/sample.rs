//! Resource samples of the soak (tally's RSS and open files, Redis' clients, memory and keys),
//! the CSV they go to, and the verdict: the slope of each over the last two thirds of the run.

/// One sample, every 10 s.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Seconds since the load started.
    pub t: f64,
    pub rss_mib: f64,
    pub fds: f64,
    pub redis_clients: f64,
    pub redis_mib: f64,
    pub keys: f64,
}

/// What is sampled, with the largest growth per hour tolerated over the last two thirds of the
/// run (after warm-up: windows open and close each minute, so the level is reached in minutes):
/// `(name, absolute bound, bound relative to the series' mean)`, whichever is larger.
pub const SERIES: [(&str, f64, f64); 5] = [
    // Allocator caches and metric histograms settle slowly; a leak of one allocation per event
    // (500/s, ~100 B) would be ~170 MiB/h.
    ("rss_mib", 2.0, 0.10),
    // A descriptor or connection leaked per reconnect or request shows as a steady climb.
    ("fds", 2.0, 0.0),
    ("redis_clients", 1.0, 0.0),
    ("redis_mib", 1.0, 0.10),
    // Keys of 1-minute windows (and idempotency records) come and go each minute: the level
    // saw-tooths; a key kept per event would add ~1.8M/h.
    ("keys", 100.0, 0.10),
];

impl Sample {
    pub const HEADER: &'static str = "t_s,rss_mib,fds,redis_clients,redis_mib,keys";

    pub fn take(t: f64, pid: u32, redis: &mut redis::Connection) -> anyhow::Result<Sample> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as f64;
        let info: String = redis::cmd("INFO").arg("clients").query(redis)?;
        let memory: String = redis::cmd("INFO").arg("memory").query(redis)?;
        let keys: u64 = redis::cmd("DBSIZE").query(redis)?;
        Ok(Sample {
            t,
            rss_mib: rss_kib / 1024.0,
            fds,
            // The soak's own sampling connection is one of them.
            redis_clients: info_field(&info, "connected_clients"),
            redis_mib: info_field(&memory, "used_memory") / (1024.0 * 1024.0),
            keys: keys as f64,
        })
    }

    pub fn get(&self, series: &str) -> f64 {
        match series {
            "rss_mib" => self.rss_mib,
            "fds" => self.fds,
            "redis_clients" => self.redis_clients,
            "redis_mib" => self.redis_mib,
            _ => self.keys,
        }
    }

    pub fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        writeln!(
            out,
            "{:.0},{:.2},{},{},{:.3},{}",
            self.t, self.rss_mib, self.fds, self.redis_clients, self.redis_mib, self.keys
        )
    }
}

fn info_field(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Least-squares slope of `ys` over `ts`, per hour (`ts` in seconds).
pub fn slope_per_hour(ts: &[f64], ys: &[f64]) -> f64 {
    let n = ts.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mt, my) = (ts.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = ts.iter().zip(ys).map(|(t, y)| (t - mt) * (y - my)).sum();
    let var: f64 = ts.iter().map(|t| (t - mt).powi(2)).sum();
    if var == 0.0 {
        0.0
    } else {
        cov / var * 3600.0
    }
}

/// The verdict lines (`series first last slope/h bound ok`) and whether every series is flat:
/// its growth per hour within its bound. A fall is not a leak (the allocator returning pages
/// after a burst steps the RSS down and it stays there): only growth is judged.
pub fn verdict(samples: &[Sample], out: &mut impl std::io::Write) -> std::io::Result<bool> {
    let tail = &samples[samples.len() / 3..];
    let ts: Vec<f64> = tail.iter().map(|s| s.t).collect();
    let mut flat = true;
    writeln!(out, "series,min,max,slope_per_hour,bound_per_hour,flat")?;
    for (name, absolute, relative) in SERIES {
        let ys: Vec<f64> = tail.iter().map(|s| s.get(name)).collect();
        let slope = slope_per_hour(&ts, &ys);
        let mean = ys.iter().sum::<f64>() / ys.len().max(1) as f64;
        let bound = absolute.max(relative * mean);
        let ok = slope <= bound;
        flat &= ok;
        let (min, max) = ys
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(*y), b.max(*y)));
        writeln!(out, "{name},{min:.2},{max:.2},{slope:.3},{bound:.3},{ok}")?;
    }
    out.flush()?;
    Ok(flat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_per_hour() {
        let ts = [0.0, 1800.0, 3600.0];
        assert!((slope_per_hour(&ts, &[1.0, 2.0, 3.0]) - 2.0).abs() < 1e-9);
        assert_eq!(slope_per_hour(&ts, &[5.0, 5.0, 5.0]), 0.0);
    }

    fn run(rss: impl Fn(f64) -> f64) -> bool {
        let samples: Vec<Sample> = (0..180)
            .map(|i| {
                let t = i as f64 * 10.0;
                Sample {
                    t,
                    rss_mib: rss(t),
                    fds: 31.0,
                    redis_clients: 4.0,
                    redis_mib: 3.0,
                    keys: 8000.0,
                }
            })
            .collect();
        verdict(&samples, &mut Vec::new()).unwrap()
    }

    #[test]
    fn growth_fails_the_verdict_a_step_down_does_not() {
        assert!(run(|_| 27.0), "level");
        assert!(!run(|t| 27.0 + t / 3600.0 * 20.0), "20 MiB/h growth");
        assert!(
            run(|t| if t < 1200.0 { 29.1 } else { 27.1 }),
            "the allocator trimming once"
        );
    }
}
