//! `tally-bench outputs`: the stream-side cost of window results. The same messages
//! go through decode → aggregate → flush to a fresh redis-server (the product's aggregator and
//! flush script, as part 3 with flushes), alternately with the counter's `output` off and on
//! (on: every unit carries its partition's highest event time and the script records it with
//! the applied offset). Rounds alternate (off, on, off, on, …) so that the shared machine's
//! noise hits both; the medians and their ratio are printed.
//!
//! ```sh
//! cargo run --release -p tally-bench -- outputs [--messages 2000000] [--rounds 3]
//! ```

use tally::config::OutputConfig;
use tally_testkit::local_redis::LocalRedis;

use crate::pipeline_loop::{load_bench_config, run_loop, Flusher, Messages};
use crate::proc_stats::median;

/// Run the comparison and print it.
pub fn role_outputs(
    messages: u64,
    keys: u64,
    partitions: i32,
    rounds: usize,
) -> anyhow::Result<()> {
    let redis = LocalRedis::start(&[])?;
    let url = redis.url();
    let off = load_bench_config(&url)?;
    let mut on = off.clone();
    for c in &mut on.counters {
        c.output = Some(OutputConfig::to("flow-windows"));
    }
    let msgs = Messages::generate(keys, 1.1, 7, messages, partitions);
    let mut secs = [Vec::new(), Vec::new()];
    for round in 0..rounds * 2 {
        let (i, config) = if round % 2 == 0 { (0, &off) } else { (1, &on) };
        let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
        let _: () = redis::cmd("FLUSHALL").query(&mut conn)?;
        let flusher = Flusher::start(&url, config, partitions)?;
        let r = run_loop(config, &msgs, partitions, Some(&flusher), None)?;
        drop(flusher.tx);
        let _ = flusher.thread.join();
        let rate = messages as f64 / r.secs;
        eprintln!(
            "round {round}: outputs {}: {:.2} s, {rate:.0} msg/s, {} flushes",
            if i == 1 { "on" } else { "off" },
            r.secs,
            r.flushes
        );
        secs[i].push(r.secs);
    }
    let (off_s, on_s) = (median(secs[0].clone()), median(secs[1].clone()));
    println!("| outputs | median s | msg/s | vs off |");
    println!("|---|---|---|---|");
    for (name, s) in [("off", off_s), ("on", on_s)] {
        println!(
            "| {name} | {s:.2} | {:.0} | {:.3} |",
            messages as f64 / s,
            off_s / s
        );
    }
    Ok(())
}
