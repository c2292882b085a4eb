//! When the fixed-rate phase's calls are due.
//!
//! By default ([`Arrivals::Ticks`], this bench's pacing since it was written) each caller sleeps
//! on tokio's timer until its own due time. tokio's timer has a 1 ms granularity, so the 40
//! callers wake on millisecond ticks: 20,000 calls/s arrive as bursts of about 20. The other
//! two spacings come from a pacer thread (its own OS thread, timer slack 1 µs, sleeping between
//! due times, never spinning: it shares the 2 cores) that hands each due time to the callers in
//! turn, at that time: evenly or as a Poisson process. Measured
//! (docs/lab/benchmarks.md): on these 2 cores the pacer's 20,000 cross-thread wake-ups a second
//! cost the client more CPU than the bursts cost the tail, so the ticks stay the default.

use std::time::{Duration, Instant};

use clap::ValueEnum;
use rand::RngExt as _;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// How the offered rate's calls are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arrivals {
    /// Evenly: one call every 1/rate (wrk2's constant throughput).
    Uniform,
    /// A Poisson process: exponential gaps of mean 1/rate (independent clients; burstier).
    Poisson,
    /// Each caller sleeps on tokio's timer until its own due time: bursts on 1 ms ticks.
    Ticks,
}

impl Arrivals {
    pub fn label(self) -> &'static str {
        match self {
            Arrivals::Uniform => "uniform",
            Arrivals::Poisson => "Poisson",
            Arrivals::Ticks => "1 ms ticks",
        }
    }
}

/// Start a pacer thread for `callers` callers: `rate` due times per second in all, from
/// `start` for `phase`, handed to the callers in turn. Each receiver ends with the phase.
pub fn start(
    arrivals: Arrivals,
    callers: usize,
    rate: u64,
    start: Instant,
    phase: Duration,
) -> Vec<UnboundedReceiver<Instant>> {
    let (txs, rxs): (Vec<UnboundedSender<Instant>>, Vec<_>) =
        (0..callers.max(1)).map(|_| unbounded_channel()).unzip();
    std::thread::spawn(move || pace(arrivals, &txs, rate, start, phase));
    rxs
}

fn pace(
    arrivals: Arrivals,
    txs: &[UnboundedSender<Instant>],
    rate: u64,
    start: Instant,
    phase: Duration,
) {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack (default 50 µs).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
    let mean = 1.0 / rate.max(1) as f64;
    let mut rng = rand::rng();
    let end = start + phase;
    let mut due = start;
    let mut i = 0usize;
    while due < end {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if txs[i % txs.len()].send(due).is_err() {
            return;
        }
        i += 1;
        let gap = match arrivals {
            Arrivals::Poisson => -(1.0 - rng.random::<f64>()).ln() * mean,
            _ => mean,
        };
        due += Duration::from_secs_f64(gap);
    }
}
