//! The main table: parts 1 to 4 and the script cost, one column per workload.

use super::fmt::{commands, counted, f2, ms, per_million, rate, sorted, thousands, ColumnTable};
use crate::proc_stats::percentile;
use crate::results::VariantResults;

type Table<'a> = ColumnTable<'a, VariantResults>;

/// Every figure of every part, in the order of the parts.
pub fn parts_table(results: &[VariantResults]) -> String {
    let mut t = ColumnTable::new(results, workload);
    raw_rows(&mut t);
    e2e_rows(&mut t);
    e2e_redis_rows(&mut t);
    pipeline_rows(&mut t);
    flush_rows(&mut t);
    baseline_rows(&mut t);
    script_rows(&mut t);
    t.into_text()
}

/// A column's header: the workload's name, keys and distribution.
fn workload(r: &VariantResults) -> String {
    let dist = if r.variant.skew > 0.0 {
        format!("Zipf s={}", r.variant.skew)
    } else {
        "uniform".into()
    };
    format!(
        "{} ({} keys, {dist})",
        r.variant.name,
        thousands(r.variant.keys as f64)
    )
}

/// Part 1: the raw consumers, read only and read + parse.
fn raw_rows(t: &mut Table) {
    t.row("**1. raw consume, read only**: msgs/s", |r| {
        rate(r.raw_read.messages as f64, r.raw_read.secs)
    });
    t.row("… CPU-s per million msgs (consumer process)", |r| {
        f2(per_million(r.raw_read.cpu, r.raw_read.messages as f64))
    });
    t.row(
        "… peak RSS of the consumer process (librdkafka and its buffers)",
        |r| format!("{:.0} MB", r.raw_read.peak_rss_mb),
    );
    t.row("**1. raw consume, read + serde_json parse**: msgs/s", |r| {
        rate(r.raw_parse.messages as f64, r.raw_parse.secs)
    });
    t.row("… CPU-s per million msgs (consumer process)", |r| {
        f2(per_million(r.raw_parse.cpu, r.raw_parse.messages as f64))
    });
    t.row(
        "… broker CPU-s per million msgs (mock cluster process)",
        |r| {
            f2(per_million(
                r.raw_parse.broker_cpu,
                r.raw_parse.messages as f64,
            ))
        },
    );
}

/// Part 2, tally end-to-end: throughput, CPU and memory, against the raw consumer.
fn e2e_rows(t: &mut Table) {
    t.row(
        "**2. tally end-to-end**: msgs/s, assigned → every offset applied in Redis",
        |r| rate(r.e2e.messages, r.e2e.secs),
    );
    t.row(
        "… msgs/s while consuming (until the consumer thread went idle)",
        |r| rate(r.e2e.messages, r.e2e.consume_secs),
    );
    t.row(
        "… ratio to raw read + parse: end-to-end (while consuming)",
        |r| {
            let raw = r.raw_parse_rate();
            format!(
                "{:.0}% ({:.0}%)",
                100.0 * r.e2e.messages / r.e2e.secs / raw,
                100.0 * r.e2e.messages / r.e2e.consume_secs / raw
            )
        },
    );
    t.row(
        "… CPU-s per million msgs (tally process, user+sys)",
        |r| f2(per_million(r.e2e.cpu, r.e2e.messages)),
    );
    t.row("… ratio to raw read + parse (CPU per msg)", |r| {
        format!(
            "{:.1}×",
            (r.e2e.cpu / r.e2e.messages) / (r.raw_parse.cpu / r.raw_parse.messages as f64)
        )
    });
    t.row("… Redis CPU-s per million msgs", |r| {
        f2(per_million(r.e2e.redis.cpu, r.e2e.messages))
    });
    t.row(
        "… all processes (tally + Redis + broker) CPU-s per million msgs",
        |r| {
            f2(per_million(
                r.e2e.cpu + r.e2e.redis.cpu + r.e2e.broker_cpu,
                r.e2e.messages,
            ))
        },
    );
    t.row(
        "… peak RSS (VmHWM); most keys pending (in memory + in flight)",
        |r| {
            format!(
                "{:.0} MB; {}",
                r.e2e.peak_rss_mb,
                thousands(r.e2e.max_pending)
            )
        },
    );
}

/// Part 2, what reached Redis: keys, commands, flushes, and whether the counts are right.
fn e2e_redis_rows(t: &mut Table) {
    t.row(
        "… counter keys in Redis; keys written per million msgs",
        |r| {
            format!(
                "{}; {}",
                thousands(r.e2e.distinct_keys as f64),
                thousands(per_million(r.e2e.keys_flushed, r.e2e.messages))
            )
        },
    );
    t.row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        |r| commands(&r.e2e.redis, r.e2e.messages),
    );
    t.row(
        "… Redis round trips per million msgs (one pipeline per flush)",
        |r| format!("{:.1}", per_million(r.e2e.flushes, r.e2e.messages)),
    );
    t.row("… flushes; mean keys per flush", |r| {
        format!(
            "{}; {}",
            r.e2e.flushes,
            thousands(r.e2e.flush_keys_sum / r.e2e.flushes)
        )
    });
    t.row(
        "… flush duration p50 / p99 (histogram, interpolated)",
        |r| format!("{} / {}", ms(r.e2e.flush_p50), ms(r.e2e.flush_p99)),
    );
    t.row(
        "… flush time per 100,000 keys (sum of durations ÷ keys)",
        |r| ms(r.e2e.flush_secs_sum / r.e2e.flush_keys_sum * 1e5),
    );
    t.row("… counts in Redis = events produced", |r| {
        counted(r.e2e.counted_ok).into()
    });
}

/// Part 3 in memory: decode → aggregate → seal, and the same with the cluster key layout when
/// every workload measured it.
fn pipeline_rows(t: &mut Table) {
    t.row(
        "**3. pipeline without Kafka**: decode → aggregate → seal, 1 thread, msgs/s",
        |r| rate(r.pipe.messages as f64, r.pipe.agg_secs),
    );
    t.row("… CPU-s per million msgs", |r| {
        f2(per_million(r.pipe.agg_cpu, r.pipe.messages as f64))
    });
    if t.columns().iter().all(|r| r.pipe.agg_cluster_secs > 0.0) {
        let label = format!(
            "… with the Redis Cluster key layout ({} shards, tagged keys): msgs/s; CPU-s per million msgs",
            tally::config::Config::default().redis.cluster_shards
        );
        t.row(&label, |r| {
            format!(
                "{}; {}",
                rate(r.pipe.messages as f64, r.pipe.agg_cluster_secs),
                f2(per_million(r.pipe.agg_cluster_cpu, r.pipe.messages as f64))
            )
        });
    }
}

/// Part 3 + flush: the same loop writing to redis-server with tally's script.
fn flush_rows(t: &mut Table) {
    t.row(
        "**3 + flush** to redis-server (tally's script, one flush in flight): msgs/s",
        |r| rate(r.pipe.messages as f64, r.pipe.flush.secs),
    );
    t.row(
        "… client CPU-s per million msgs (both threads); Redis CPU-s",
        |r| {
            format!(
                "{}; {}",
                f2(per_million(r.pipe.flush.cpu, r.pipe.messages as f64)),
                f2(per_million(r.pipe.flush_redis.cpu, r.pipe.messages as f64))
            )
        },
    );
    t.row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        |r| commands(&r.pipe.flush_redis, r.pipe.messages as f64),
    );
    t.row("… flushes; mean / max keys per flush", |r| {
        let k = &r.pipe.flush.flush_keys;
        let mean = k.iter().sum::<u64>() as f64 / k.len().max(1) as f64;
        format!(
            "{}; {} / {}",
            k.len(),
            thousands(mean),
            thousands(k.iter().copied().max().unwrap_or(0) as f64)
        )
    });
    t.row("… flush duration p50 / p99 (exact)", |r| {
        let s = sorted(&r.pipe.flush.flush_secs);
        format!("{} / {}", ms(percentile(&s, 0.5)), ms(percentile(&s, 0.99)))
    });
    t.row("… flush time per 100,000 keys", |r| {
        let k = &r.pipe.flush.flush_keys;
        if k.iter().sum::<u64>() < 10_000 * k.len() as u64 {
            "n/a (small flushes)".into()
        } else {
            ms(r.pipe_ms_per_100k() / 1e3)
        }
    });
}

/// Part 4, one script call per event, and what pre-aggregation gains over it.
fn baseline_rows(t: &mut Table) {
    t.row("**4. per-message baseline** (one Lua INCRBY + PEXPIREAT per event, 1,000 per round trip): msgs/s", |r| {
        rate(r.pipe.base_messages as f64, r.pipe.base_secs)
    });
    t.row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        |r| commands(&r.pipe.base_redis, r.pipe.base_messages as f64),
    );
    t.row("… client CPU-s; Redis CPU-s per million msgs", |r| {
        format!(
            "{}; {}",
            f2(per_million(r.pipe.base_cpu, r.pipe.base_messages as f64)),
            f2(per_million(
                r.pipe.base_redis.cpu,
                r.pipe.base_messages as f64
            ))
        )
    });
    t.row(
        "… gain of pre-aggregation, (3 + flush) ÷ 4: msgs/s; commands sent; commands executed",
        |r| {
            let speed = (r.pipe.messages as f64 / r.pipe.flush.secs)
                / (r.pipe.base_messages as f64 / r.pipe.base_secs);
            let sent = (r.pipe.base_redis.top_level() / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.top_level() / r.pipe.messages as f64);
            let all = (r.pipe.base_redis.commands / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.commands / r.pipe.messages as f64);
            format!("{speed:.1}×; {sent:.0}×; {all:.1}×")
        },
    );
}

/// The script's cost against bare INCRBY (and INCRBY + PEXPIREAT), then the counts of 3 and 4.
fn script_rows(t: &mut Table) {
    t.row(
        "**Script cost**: one flush's units (keys; units) applied, every key new, keys/s with tally's script vs a script doing only INCRBY (target ≥ 0.8×)",
        |r| {
            let ratio = r.pipe.incrby_only_secs / r.pipe.fenced_secs;
            format!(
                "{}; {}: {} vs {} ({ratio:.2}×)",
                thousands(r.pipe.fence_keys as f64),
                r.pipe.fence_units,
                thousands(r.pipe.fence_keys as f64 / r.pipe.fenced_secs),
                thousands(r.pipe.fence_keys as f64 / r.pipe.incrby_only_secs),
            )
        },
    );
    t.row(
        "… the same units, every key existing (steady state): keys/s tally vs INCRBY only",
        |r| {
            let p = &r.pipe;
            format!(
                "{} vs {} ({:.2}×)",
                thousands(p.fence_keys as f64 / p.fenced_existing_secs),
                thousands(p.fence_keys as f64 / p.incrby_only_existing_secs),
                p.incrby_only_existing_secs / p.fenced_existing_secs
            )
        },
    );
    t.row(
        "… against a script doing INCRBY + PEXPIREAT per key: keys new; keys existing",
        |r| {
            let p = &r.pipe;
            format!(
                "{} vs {} ({:.2}×); {} vs {} ({:.2}×)",
                thousands(p.fence_keys as f64 / p.fenced_secs),
                thousands(p.fence_keys as f64 / p.incrby_expire_secs),
                p.incrby_expire_secs / p.fenced_secs,
                thousands(p.fence_keys as f64 / p.fenced_existing_secs),
                thousands(p.fence_keys as f64 / p.incrby_expire_existing_secs),
                p.incrby_expire_existing_secs / p.fenced_existing_secs
            )
        },
    );
    t.row("… counts in Redis = events (3 + flush; 4)", |r| {
        format!(
            "{}; {}",
            counted(r.pipe.flush_counted_ok),
            counted(r.pipe.base_counted_ok)
        )
    });
}
