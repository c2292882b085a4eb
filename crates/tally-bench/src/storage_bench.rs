//! `tally-storage-bench`: bytes per counter in Redis, string keys vs hash storage, written by
//! the product's own decoder, aggregator and flush scripts (no Kafka) into a fresh
//! redis-server, measured with `INFO memory` (`used_memory` after minus before):
//!
//! ```sh
//! cargo run --release -p tally-bench --bin tally-storage-bench -- [--counters 1000000]
//! ```

mod alloc_switch;

use std::time::Instant;

use clap::Parser;
use tally::config::{Config, Storage};
use tally::model::state_keys::StateKeys;
use tally::stream::aggregate::Aggregator;
use tally::stream::sink::script::{apply_cmd, apply_kinds_cmd, APPLY_KINDS_LUA, APPLY_LUA};
use tally_testkit::gen::EventGen;
use tally_testkit::local_redis::LocalRedis;

#[derive(Parser)]
#[command(name = "tally-storage-bench")]
struct Cli {
    /// Distinct counters (one event each).
    #[arg(long, default_value_t = 1_000_000)]
    counters: u64,
}

fn used_memory(conn: &mut redis::Connection) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no used_memory in INFO"))
}

/// Write `n` counters with `storage`; bytes per counter and seconds.
fn run(url: &str, n: u64, storage: Storage) -> anyhow::Result<(f64, f64, i64)> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("FLUSHALL").query(&mut conn)?;
    let mut config = Config::default();
    config.redis.url = url.into();
    if storage == Storage::Hash {
        config.counters[0].storage = Storage::Hash;
        config.counters[0].hash_key = Some("flow:h:{yyyyMMddHH}".into());
    }
    let model = tally::config::Model::compile(config.clone())?;
    let (decoder, counters) = tally::stream::aggregate::stages(&model);
    let mut agg = Aggregator::new(counters, 1, config.flush.max_keys_per_call);
    agg.assign(0, &[0]);
    let keys = StateKeys {
        fence: "tally:applied:storage:events:0:0".into(),
        marker: "tally:state:storage:events:0".into(),
    };
    let apply: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_LUA)
        .query(&mut conn)?;
    let kinds: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(APPLY_KINDS_LUA)
        .query(&mut conn)?;
    let _: () = redis::cmd("SET").arg(&keys.fence).arg(0).query(&mut conn)?;
    let before = used_memory(&mut conn)?;
    let started = Instant::now();
    let now = chrono::Utc::now().timestamp_millis();
    let mut buf = Vec::with_capacity(128);
    for k in 0..n {
        EventGen::write_json(&mut buf, k, now);
        let event = decoder.decode(Some(&buf), Some(now))?;
        agg.add(0, k as i64, &event, now);
        if agg.pending_keys() >= 100_000 || k + 1 == n {
            let mut pipe = redis::pipe();
            for u in agg.seal(None).units {
                pipe.add_command(if u.other.is_empty() {
                    apply_cmd(&apply, &keys, &u, false)
                } else {
                    apply_kinds_cmd(&kinds, &keys, &u, false)
                });
            }
            let _: Vec<redis::Value> = pipe.query(&mut conn)?;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let after = used_memory(&mut conn)?;
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut conn)?;
    Ok(((after - before) as f64 / n as f64, secs, dbsize))
}

/// jemalloc, as `tally` (or glibc's malloc: `TALLY_BENCH_ALLOCATOR=system`).
#[global_allocator]
static ALLOCATOR: alloc_switch::Switch = alloc_switch::Switch;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let redis = LocalRedis::start(&[])?;
    println!("# Bytes per counter in Redis: string keys vs hash storage\n");
    println!(
        "{} counters (`flow`: app/device/ip per hour), one redis-server 7.0, `INFO memory` used_memory after − before\n",
        cli.counters
    );
    println!("| storage | bytes / counter | keys in Redis | write time s |");
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    for storage in [Storage::String, Storage::Hash] {
        let (bytes, secs, dbsize) = run(&redis.url(), cli.counters, storage)?;
        println!("| {storage:?} | {bytes:.1} | {dbsize} | {secs:.2} |");
        rows.push(bytes);
    }
    println!("\nhash / string: {:.2}×", rows[1] / rows[0]);
    Ok(())
}
