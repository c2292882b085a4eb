//! The report: every figure as a Markdown table, then the other results and the targets.
//!
//! `parts.rs` (the main table, parts 1 to 4), `scaling.rs` and `cluster.rs` (part 2 in other
//! shapes and on a cluster), `targets.rs` (the targets of the speed plan); `fmt.rs` formats numbers and
//! prints tables for all of them. Everything read comes from `crate::results`.

mod cluster;
mod fmt;
mod parts;
mod scaling;
mod targets;

use crate::latency::Latency;
use crate::memprobe::MemResult;
use crate::results::{Machine, VariantResults};

use fmt::{ms, thousands};

/// `mem`: all of 1,000,000 pending keys flushed at once; `capped`: one regular flush of them.
pub fn report(
    m: &Machine,
    results: &[VariantResults],
    mem: &MemResult,
    capped: &MemResult,
    lat: &Latency,
) {
    print_machine(m);
    println!("{}", parts::parts_table(results));
    print_scaling(results);
    print_cluster(results);
    print_latency(lat);
    print_memory(mem, capped);
    print_threads(results);
    targets::print_targets(m, results, mem, lat);
}

/// The title, and the machine and run the figures come from.
fn print_machine(m: &Machine) {
    println!("\n## tally-bench results\n");
    println!(
        "`{}` × {} cores, redis-server {}; {} messages per variant over {} partitions, {} batches{}; load average {} at start, {} at end; the run took {:.0} s.\n",
        m.cpu, m.cores, m.redis, thousands(m.total as f64), m.partitions, m.compression, if m.quick { " (--quick)" } else { "" }, m.load_start, m.load_end, m.secs
    );
}

fn print_scaling(results: &[VariantResults]) {
    if let Some(table) = scaling::scaling_table(results) {
        println!(
            "**Scaling and merged calls** (part 2 again on the same topic: two consumer lanes in \
             one process (`kafka.consumers = 2`), two tally processes with one lane each in one \
             group, then one lane with merged calls off (`flush.max_keys_per_merged_call = 0`); \
             time starts when the first process holds its share of the partitions, so joins and \
             rebalances count; CPU and RSS summed over processes):\n"
        );
        println!("{table}");
    }
}

fn print_cluster(results: &[VariantResults]) {
    if let Some(table) = cluster::cluster_table(results) {
        println!(
            "**Standalone vs 3-primary cluster** (part 2 on one redis-server, then on a local Redis \
             Cluster of 3 primaries without replicas, default cluster_shards; Redis CPU and keys \
             per server from INFO and SCAN on each primary):\n"
        );
        println!("{table}");
    }
}

fn print_latency(lat: &Latency) {
    println!(
        "**Event-to-visible latency** (tally live at {} events/s, a marker event every 10 ms, Redis polled every 2 ms): \
         p50 {}, p99 {}, max {} over {} markers; flush interval {:.0} ms; flush duration p50 / p99 meanwhile {} / {}.\n",
        thousands(lat.rate), ms(lat.p50), ms(lat.p99), ms(lat.max), lat.markers, lat.interval * 1e3, ms(lat.flush_p50), ms(lat.flush_p99)
    );
}

fn print_memory(mem: &MemResult, capped: &MemResult) {
    println!(
        "**Memory probe** (decoder + aggregator without Kafka): RSS {:.0} MB → {:.0} MB with {} distinct keys pending ({:.0} bytes per key); \
         peak {:.0} MB while a regular flush (capped at flush.max_keys: {} keys) is sealed and encoded as the sink does it, a chunk at a time (largest packed chunk {:.0} MB, held twice); \
         peak {:.0} MB when all of them are flushed at once, as on revoke or shutdown (largest packed chunk {:.0} MB).\n",
        mem.rss_before_mb, mem.rss_pending_mb, thousands(mem.pending as f64),
        (mem.rss_pending_mb - mem.rss_before_mb) * 1024.0 * 1024.0 / mem.pending.max(1) as f64,
        capped.hwm_mb, thousands(capped.flush_keys as f64), capped.encoded_mb, mem.hwm_mb, mem.encoded_mb
    );
}

/// tally's busiest threads in each workload's part 2.
fn print_threads(results: &[VariantResults]) {
    for r in results {
        let top: Vec<String> = r
            .e2e
            .threads
            .iter()
            .take(6)
            .map(|(n, c)| format!("{n} {c:.2} s"))
            .collect();
        println!(
            "**tally's CPU by thread** ({}: {:.2} s for {} msgs): {}\n",
            r.variant.name,
            r.e2e.cpu,
            thousands(r.e2e.messages),
            top.join(", ")
        );
    }
}
