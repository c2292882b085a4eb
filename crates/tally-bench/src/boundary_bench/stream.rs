//! The stream side of the boundary benchmark: tally's decoder, aggregator and flush script
//! (the product's code, fed from memory), one window's worth of new keys at each window start.

use std::time::{Duration, Instant};

use anyhow::bail;
use tally::config::{Config, CounterConfig, Model};
use tally::stream::aggregate::Aggregator;
use tally::stream::decode::Decoder;
use tally::stream::sink::script::{apply_cmd, ApplyReply, APPLY_LUA};
use tally::stream::sink::FenceScope;

use super::Cli;

/// Unix ms now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One window's first flush: when it began, how long it took, how many keys it created.
pub struct Flush {
    pub start_ms: i64,
    pub secs: f64,
    pub keys: usize,
}

/// What the stream did in one mode.
pub struct StreamResult {
    pub flushes: Vec<Flush>,
    /// Window end + retention of every window written: when its keys' expiry begins.
    pub expiries: Vec<i64>,
    /// The run's measured span (Unix ms).
    pub from_ms: i64,
    pub to_ms: i64,
}

impl StreamResult {
    /// Which zone a call starting at `at_ms` falls in: `span` ms after an expiry instant (and
    /// 0.5 s before it), during a first flush (and 0.5 s after it), or between.
    pub fn zone(&self, at_ms: i64, span: i64) -> Option<&'static str> {
        if at_ms < self.from_ms || at_ms > self.to_ms {
            return None;
        }
        if self
            .expiries
            .iter()
            .any(|&e| (e - 500..=e + span).contains(&at_ms))
        {
            return Some("around expiry");
        }
        let flushing = |f: &Flush| {
            let end = f.start_ms + (f.secs * 1000.0) as i64 + 500;
            (f.start_ms..=end).contains(&at_ms)
        };
        if self.flushes.iter().any(flushing) {
            return Some("first flush");
        }
        Some("between")
    }
}

/// A counter, its compiled model and a connection, ready to write windows.
pub struct Plan {
    model: std::sync::Arc<Model>,
    conn: redis::Connection,
    keys: usize,
    window_ms: i64,
    retention_ms: i64,
    boundaries: usize,
}

impl Plan {
    /// One count counter `boundary:{device}:{time}` with `cli`'s window and retention, and
    /// `spread` as its `expiry_spread` (None: the default).
    pub fn new(cli: &Cli, url: &str, spread: Option<Duration>) -> anyhow::Result<Plan> {
        let model = model(cli, url, spread)?;
        let conn = redis::Client::open(url)?.get_connection()?;
        Ok(Plan {
            model,
            conn,
            keys: cli.keys,
            window_ms: cli.window as i64 * 1000,
            retention_ms: cli.retention as i64 * 1000,
            boundaries: cli.boundaries,
        })
    }

    /// The counter's spread, ms.
    pub fn spread_ms(&self) -> i64 {
        self.model.counters[0].expiry_spread_ms
    }

    /// Write `boundaries` windows from `start` (a window start), each at its start, then wait
    /// until `end_ms` (every window's keys expired).
    pub fn run(mut self, start: i64, end_ms: i64) -> anyhow::Result<StreamResult> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(APPLY_LUA)
            .query(&mut self.conn)?;
        let scope = FenceScope::new(
            &self.model.config.redis,
            &self.model.config.kafka.group_id,
            &self.model.config.kafka.topic,
        );
        redis::cmd("SET")
            .arg(scope.key(0, 0))
            .arg(0)
            .query::<()>(&mut self.conn)?;
        let (decoder, counters) = tally::stream::aggregate::stages(&self.model);
        let mut agg = Aggregator::new(counters, 1, self.model.config.flush.max_keys_per_call);
        agg.assign(0, &[0]);
        let mut result = StreamResult {
            flushes: Vec::new(),
            expiries: Vec::new(),
            from_ms: start,
            to_ms: end_ms,
        };
        let mut offset = 0i64;
        for k in 0..self.boundaries as i64 {
            let window_start = start + k * self.window_ms;
            sleep_until(window_start);
            let started = Instant::now();
            let keys = self.write_window(&decoder, &mut agg, &mut offset, &scope, &sha)?;
            result.flushes.push(Flush {
                start_ms: window_start,
                secs: started.elapsed().as_secs_f64(),
                keys,
            });
            result
                .expiries
                .push(window_start + self.window_ms + self.retention_ms);
        }
        sleep_until(end_ms);
        Ok(result)
    }

    /// Count every device once in the current window and flush: the window's first flush.
    fn write_window(
        &mut self,
        decoder: &Decoder,
        agg: &mut Aggregator,
        offset: &mut i64,
        scope: &FenceScope,
        sha: &str,
    ) -> anyhow::Result<usize> {
        let now = now_ms();
        for d in 0..self.keys {
            let payload = format!(r#"{{"device":"d{d}"}}"#);
            let Ok(event) = decoder.decode(Some(payload.as_bytes()), Some(now)) else {
                bail!("the benchmark's event does not decode");
            };
            agg.add(0, *offset, &event, now);
            *offset += 1;
        }
        let batch = agg.seal(None);
        let mut keys = 0;
        for unit in &batch.units {
            keys += unit.keys.len();
            let cmd = apply_cmd(sha, &scope.keys(unit.partition, unit.shard), unit, false);
            let reply: redis::Value = cmd.query(&mut self.conn)?;
            match ApplyReply::parse(&reply).map_err(anyhow::Error::msg)? {
                ApplyReply::Applied { .. } => {}
                other => bail!("unit not applied: {other:?}"),
            }
        }
        Ok(keys)
    }
}

/// The benchmark's one counter, `boundary:{device}:{time}`, with `cli`'s window and retention
/// and `spread` as its `expiry_spread` (None: the default), compiled as tally compiles it.
fn model(cli: &Cli, url: &str, spread: Option<Duration>) -> anyhow::Result<std::sync::Arc<Model>> {
    let counter = CounterConfig {
        name: "boundary".into(),
        dimensions: vec!["device".into()],
        key: "boundary:{device}:{yyyyMMddHHmmss}".into(),
        window: Duration::from_secs(cli.window),
        retention: Duration::from_secs(cli.retention),
        expiry_spread: spread,
        ..CounterConfig::reference()
    };
    let mut config = Config {
        counters: vec![counter],
        ..Config::default()
    };
    config.redis.url = url.into();
    Ok(Model::compile(config)?)
}

/// Seconds to decode and aggregate one window of `cli.keys` new keys and seal it, in memory
/// (no Redis): what spreading adds to the stream's CPU (a hash of each new key).
pub fn aggregate_secs(cli: &Cli, spread: Option<Duration>) -> anyhow::Result<f64> {
    let model = model(cli, "redis://127.0.0.1:6379", spread)?;
    let (decoder, counters) = tally::stream::aggregate::stages(&model);
    let mut agg = Aggregator::new(counters, 1, model.config.flush.max_keys_per_call);
    agg.assign(0, &[0]);
    let payloads: Vec<String> = (0..cli.keys)
        .map(|d| format!(r#"{{"device":"d{d}"}}"#))
        .collect();
    let now = now_ms();
    let started = Instant::now();
    for (offset, payload) in payloads.iter().enumerate() {
        let Ok(event) = decoder.decode(Some(payload.as_bytes()), Some(now)) else {
            bail!("the benchmark's event does not decode");
        };
        agg.add(0, offset as i64, &event, now);
    }
    let batch = agg.seal(None);
    let secs = started.elapsed().as_secs_f64();
    std::hint::black_box(batch);
    Ok(secs)
}

fn sleep_until(at_ms: i64) {
    let wait = at_ms - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}
