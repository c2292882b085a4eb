//! The speed targets, each met or a measured gap with what bounds it.

use super::fmt::{ms, per_million, thousands};
use crate::e2e::{E2e, Shape};
use crate::latency::Latency;
use crate::memprobe::MemResult;
use crate::results::{Machine, VariantResults};

fn target(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

/// What the machine did during a part-2 run: Redis' share of a core and every process' cores.
fn load(e: &E2e, cores: usize) -> String {
    let redis = e.redis.cpu / e.secs;
    let all = (e.cpu + e.redis.cpu + e.broker_cpu) / e.secs;
    format!(
        "Redis busy {:.0}% of its core, tally + Redis + broker {:.2} of {cores} cores",
        100.0 * redis,
        all
    )
}

fn shape_label(s: Shape) -> String {
    match (s.replicas, s.lanes, s.merge) {
        (1, 1, true) => "1 lane".into(),
        (1, l, true) => format!("{l} lanes"),
        (r, 1, true) => format!("{r} replicas"),
        (_, _, false) => "merged calls off".into(),
        (r, l, _) => format!("{r} replicas × {l} lanes"),
    }
}

pub fn print_targets(m: &Machine, results: &[VariantResults], mem: &MemResult, lat: &Latency) {
    println!("### Targets\n");
    for r in results {
        print_throughput(r, m.cores);
    }
    print_cpu(results);
    print_rss(results, mem);
    for r in results {
        print_script(r);
    }
    print_latency(lat);
    for r in results {
        print_scaling(r);
    }
}

/// End-to-end against raw read + parse, per shape with merged calls; the best one judged.
fn print_throughput(r: &VariantResults, cores: usize) {
    let raw = r.raw_parse_rate();
    let goal = if r.variant.name == "cold" { 0.6 } else { 0.9 };
    let shapes = std::iter::once((Shape::ONE, &r.e2e)).chain(
        r.scaling
            .iter()
            .filter(|(s, _)| s.merge)
            .map(|(s, e)| (*s, e)),
    );
    let ratios: Vec<(String, f64, &E2e)> = shapes
        .map(|(s, e)| (shape_label(s), e.messages / e.secs / raw, e))
        .collect();
    let best = ratios
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("one lane is always measured");
    let listed: Vec<String> = ratios
        .iter()
        .map(|(l, x, _)| format!("{l} {x:.2}"))
        .collect();
    println!(
        "- [{}] end-to-end ≥ {goal} × raw read + parse: {} — {} (best: {}); bound: {}",
        r.variant.name,
        listed.join(", "),
        target(best.1 >= goal),
        best.0,
        load(best.2, cores)
    );
}

/// tally's CPU per million events on the main workload.
fn print_cpu(results: &[VariantResults]) {
    if let Some(r) = results.iter().find(|r| r.variant.name == "main") {
        let cpu = per_million(r.e2e.cpu, r.e2e.messages);
        let raw = r.raw_parse.cpu / r.raw_parse.messages as f64 * 1e6;
        println!(
            "- [main] ≤ 1.0 CPU-s per million events in tally's process: {cpu:.2} — {}; a raw read + parse consumer uses {raw:.2} on this machine ({:.2}× of it)",
            target(cpu <= 1.0),
            cpu / raw
        );
    }
}

/// Peak RSS with 1,000,000 keys pending (the cold workload and the memory probe).
fn print_rss(results: &[VariantResults], mem: &MemResult) {
    if let Some(r) = results.iter().find(|r| r.variant.name == "cold") {
        println!(
            "- peak RSS < 200 MB with 1,000,000 keys pending: tally end-to-end (cold) {:.0} MB with up to {} keys pending — {}; of it librdkafka alone (raw consumer) {:.0} MB; the aggregator holds 1,000,000 keys in {:.0} MB (memory probe)",
            r.e2e.peak_rss_mb,
            thousands(r.e2e.max_pending),
            if r.e2e.max_pending < 1e6 {
                "not reached (fewer keys pending: run without --quick)"
            } else {
                target(r.e2e.peak_rss_mb < 200.0)
            },
            r.raw_parse.peak_rss_mb,
            mem.rss_pending_mb - mem.rss_before_mb
        );
    }
}

/// tally's script against an INCRBY-only script, keys new and keys existing.
fn print_script(r: &VariantResults) {
    let p = &r.pipe;
    let new = p.incrby_only_secs / p.fenced_secs;
    let existing = p.incrby_only_existing_secs / p.fenced_existing_secs;
    println!(
        "- [{}] script ≥ 0.8 × an INCRBY-only script (keys/s): every key new {new:.2}, every key existing {existing:.2} — {}; against INCRBY + PEXPIREAT per key {:.2} / {:.2}",
        r.variant.name,
        target(new >= 0.8 && existing >= 0.8),
        p.incrby_expire_secs / p.fenced_secs,
        p.incrby_expire_existing_secs / p.fenced_existing_secs
    );
}

/// Event-to-visible p99 against the flush interval.
fn print_latency(lat: &Latency) {
    let limit = lat.interval + 0.05;
    println!(
        "- event-to-visible p99 ≤ flush interval + 50 ms: {} vs {} — {}",
        ms(lat.p99),
        ms(limit),
        target(lat.p99 <= limit)
    );
}

/// Each shape with merged calls against one lane, while consuming and end-to-end.
fn print_scaling(r: &VariantResults) {
    let base = r.e2e.messages / r.e2e.consume_secs;
    for (s, e) in r.scaling.iter().filter(|(s, _)| s.merge) {
        println!(
            "- [{}] scale with cores, {} ÷ 1 lane: {:.2}× while consuming, {:.2}× end-to-end",
            r.variant.name,
            shape_label(*s),
            e.messages / e.consume_secs / base,
            (e.messages / e.secs) / (r.e2e.messages / r.e2e.secs)
        );
    }
}
