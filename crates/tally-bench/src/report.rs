//! The report: every figure as a Markdown table, then the other results and the targets.

use crate::latency::Latency;
use crate::memprobe::MemResult;
use crate::orchestrate::VariantResults;
use crate::proc_stats::percentile;
use crate::report_cluster::cluster_table;
use crate::report_scaling::scaling_table;

pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub redis: String,
    pub load_start: String,
    pub load_end: String,
    pub secs: f64,
    pub quick: bool,
    pub total: u64,
    pub partitions: i32,
    pub compression: String,
}

pub fn rate(n: f64, secs: f64) -> String {
    if secs <= 0.0 {
        return "n/a".into();
    }
    thousands(n / secs)
}

pub fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn per_million(x: f64, n: f64) -> f64 {
    x / n * 1e6
}

pub fn ms(secs: f64) -> String {
    if secs.is_finite() {
        format!("{:.1} ms", secs * 1e3)
    } else {
        "n/a".into()
    }
}

pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

impl VariantResults {
    pub fn raw_parse_rate(&self) -> f64 {
        self.raw_parse.messages as f64 / self.raw_parse.secs
    }

    /// Milliseconds per 100,000 keys over all flushes of part 3 (+ flush).
    pub fn pipe_ms_per_100k(&self) -> f64 {
        let secs: f64 = self.pipe.flush.flush_secs.iter().sum();
        let keys: u64 = self.pipe.flush.flush_keys.iter().sum();
        secs / keys.max(1) as f64 * 1e5 * 1e3
    }
}

/// `mem`: all of 1,000,000 pending keys flushed at once; `capped`: one regular flush of them.
pub fn report(
    m: &Machine,
    results: &[VariantResults],
    mem: &MemResult,
    capped: &MemResult,
    lat: &Latency,
) {
    let mut t = String::new();
    let head: Vec<String> = results
        .iter()
        .map(|r| {
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
        })
        .collect();
    t.push_str(&format!(
        "| | {} |\n|---|{}\n",
        head.join(" | "),
        "---|".repeat(results.len())
    ));
    let mut row = |name: &str, f: &dyn Fn(&VariantResults) -> String| {
        let cells: Vec<String> = results.iter().map(f).collect();
        t.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    };
    let f2 = |x: f64| format!("{x:.2}");
    row("**1. raw consume, read only**: msgs/s", &|r| {
        rate(r.raw_read.messages as f64, r.raw_read.secs)
    });
    row("… CPU-s per million msgs (consumer process)", &|r| {
        f2(per_million(r.raw_read.cpu, r.raw_read.messages as f64))
    });
    row(
        "… peak RSS of the consumer process (librdkafka and its buffers)",
        &|r| format!("{:.0} MB", r.raw_read.peak_rss_mb),
    );
    row(
        "**1. raw consume, read + serde_json parse**: msgs/s",
        &|r| rate(r.raw_parse.messages as f64, r.raw_parse.secs),
    );
    row("… CPU-s per million msgs (consumer process)", &|r| {
        f2(per_million(r.raw_parse.cpu, r.raw_parse.messages as f64))
    });
    row(
        "… broker CPU-s per million msgs (mock cluster process)",
        &|r| {
            f2(per_million(
                r.raw_parse.broker_cpu,
                r.raw_parse.messages as f64,
            ))
        },
    );
    row(
        "**2. tally end-to-end**: msgs/s, assigned → every offset applied in Redis",
        &|r| rate(r.e2e.messages, r.e2e.secs),
    );
    row(
        "… msgs/s while consuming (until the consumer thread went idle)",
        &|r| rate(r.e2e.messages, r.e2e.consume_secs),
    );
    row(
        "… ratio to raw read + parse: end-to-end (while consuming)",
        &|r| {
            let raw = r.raw_parse_rate();
            format!(
                "{:.0}% ({:.0}%)",
                100.0 * r.e2e.messages / r.e2e.secs / raw,
                100.0 * r.e2e.messages / r.e2e.consume_secs / raw
            )
        },
    );
    row(
        "… CPU-s per million msgs (tally process, user+sys)",
        &|r| f2(per_million(r.e2e.cpu, r.e2e.messages)),
    );
    row("… ratio to raw read + parse (CPU per msg)", &|r| {
        format!(
            "{:.1}×",
            (r.e2e.cpu / r.e2e.messages) / (r.raw_parse.cpu / r.raw_parse.messages as f64)
        )
    });
    row("… Redis CPU-s per million msgs", &|r| {
        f2(per_million(r.e2e.redis.cpu, r.e2e.messages))
    });
    row(
        "… all processes (tally + Redis + broker) CPU-s per million msgs",
        &|r| {
            f2(per_million(
                r.e2e.cpu + r.e2e.redis.cpu + r.e2e.broker_cpu,
                r.e2e.messages,
            ))
        },
    );
    row(
        "… peak RSS (VmHWM); most keys pending (in memory + in flight)",
        &|r| {
            format!(
                "{:.0} MB; {}",
                r.e2e.peak_rss_mb,
                thousands(r.e2e.max_pending)
            )
        },
    );
    row(
        "… counter keys in Redis; keys written per million msgs",
        &|r| {
            format!(
                "{}; {}",
                thousands(r.e2e.distinct_keys as f64),
                thousands(per_million(r.e2e.keys_flushed, r.e2e.messages))
            )
        },
    );
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(r.e2e.redis.top_level(), r.e2e.messages)),
                thousands(per_million(r.e2e.redis.script_inner(), r.e2e.messages))
            )
        },
    );
    row(
        "… Redis round trips per million msgs (one pipeline per flush)",
        &|r| format!("{:.1}", per_million(r.e2e.flushes, r.e2e.messages)),
    );
    row("… flushes; mean keys per flush", &|r| {
        format!(
            "{}; {}",
            r.e2e.flushes,
            thousands(r.e2e.flush_keys_sum / r.e2e.flushes)
        )
    });
    row(
        "… flush duration p50 / p99 (histogram, interpolated)",
        &|r| format!("{} / {}", ms(r.e2e.flush_p50), ms(r.e2e.flush_p99)),
    );
    row(
        "… flush time per 100,000 keys (sum of durations ÷ keys)",
        &|r| ms(r.e2e.flush_secs_sum / r.e2e.flush_keys_sum * 1e5),
    );
    row("… counts in Redis = events produced", &|r| {
        if r.e2e.counted_ok {
            "yes".into()
        } else {
            "**NO**".into()
        }
    });
    row(
        "**3. pipeline without Kafka**: decode → aggregate → seal, 1 thread, msgs/s",
        &|r| rate(r.pipe.messages as f64, r.pipe.agg_secs),
    );
    row("… CPU-s per million msgs", &|r| {
        f2(per_million(r.pipe.agg_cpu, r.pipe.messages as f64))
    });
    if results.iter().all(|r| r.pipe.agg_cluster_secs > 0.0) {
        let label = format!(
            "… with the Redis Cluster key layout ({} shards, tagged keys): msgs/s; CPU-s per million msgs",
            tally::config::Config::default().redis.cluster_shards
        );
        row(&label, &|r| {
            format!(
                "{}; {}",
                rate(r.pipe.messages as f64, r.pipe.agg_cluster_secs),
                f2(per_million(r.pipe.agg_cluster_cpu, r.pipe.messages as f64))
            )
        });
    }
    row(
        "**3 + flush** to redis-server (tally's script, one flush in flight): msgs/s",
        &|r| rate(r.pipe.messages as f64, r.pipe.flush.secs),
    );
    row(
        "… client CPU-s per million msgs (both threads); Redis CPU-s",
        &|r| {
            format!(
                "{}; {}",
                f2(per_million(r.pipe.flush.cpu, r.pipe.messages as f64)),
                f2(per_million(r.pipe.flush_redis.cpu, r.pipe.messages as f64))
            )
        },
    );
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(
                    r.pipe.flush_redis.top_level(),
                    r.pipe.messages as f64
                )),
                thousands(per_million(
                    r.pipe.flush_redis.script_inner(),
                    r.pipe.messages as f64
                ))
            )
        },
    );
    row("… flushes; mean / max keys per flush", &|r| {
        let k = &r.pipe.flush.flush_keys;
        let mean = k.iter().sum::<u64>() as f64 / k.len().max(1) as f64;
        format!(
            "{}; {} / {}",
            k.len(),
            thousands(mean),
            thousands(k.iter().copied().max().unwrap_or(0) as f64)
        )
    });
    row("… flush duration p50 / p99 (exact)", &|r| {
        let s = sorted(&r.pipe.flush.flush_secs);
        format!("{} / {}", ms(percentile(&s, 0.5)), ms(percentile(&s, 0.99)))
    });
    row("… flush time per 100,000 keys", &|r| {
        let k = &r.pipe.flush.flush_keys;
        if k.iter().sum::<u64>() < 10_000 * k.len() as u64 {
            "n/a (small flushes)".into()
        } else {
            ms(r.pipe_ms_per_100k() / 1e3)
        }
    });
    row("**4. per-message baseline** (one Lua INCRBY + PEXPIREAT per event, 1,000 per round trip): msgs/s", &|r| rate(r.pipe.base_messages as f64, r.pipe.base_secs));
    row(
        "… Redis commands per million msgs: sent (run inside scripts)",
        &|r| {
            format!(
                "{} ({})",
                thousands(per_million(
                    r.pipe.base_redis.top_level(),
                    r.pipe.base_messages as f64
                )),
                thousands(per_million(
                    r.pipe.base_redis.script_inner(),
                    r.pipe.base_messages as f64
                ))
            )
        },
    );
    row("… client CPU-s; Redis CPU-s per million msgs", &|r| {
        format!(
            "{}; {}",
            f2(per_million(r.pipe.base_cpu, r.pipe.base_messages as f64)),
            f2(per_million(
                r.pipe.base_redis.cpu,
                r.pipe.base_messages as f64
            ))
        )
    });
    row(
        "… gain of pre-aggregation, (3 + flush) ÷ 4: msgs/s; commands sent; commands executed",
        &|r| {
            let speed = (r.pipe.messages as f64 / r.pipe.flush.secs)
                / (r.pipe.base_messages as f64 / r.pipe.base_secs);
            let sent = (r.pipe.base_redis.top_level() / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.top_level() / r.pipe.messages as f64);
            let all = (r.pipe.base_redis.commands / r.pipe.base_messages as f64)
                / (r.pipe.flush_redis.commands / r.pipe.messages as f64);
            format!("{speed:.1}×; {sent:.0}×; {all:.1}×")
        },
    );
    row(
        "**Script cost**: one flush's units (keys; units) applied, every key new, keys/s with tally's script vs a script doing only INCRBY (target ≥ 0.8×)",
        &|r| {
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
    row(
        "… the same units, every key existing (steady state): keys/s tally vs INCRBY only",
        &|r| {
            let p = &r.pipe;
            format!(
                "{} vs {} ({:.2}×)",
                thousands(p.fence_keys as f64 / p.fenced_existing_secs),
                thousands(p.fence_keys as f64 / p.incrby_only_existing_secs),
                p.incrby_only_existing_secs / p.fenced_existing_secs
            )
        },
    );
    row(
        "… against a script doing INCRBY + PEXPIREAT per key: keys new; keys existing",
        &|r| {
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
    row("… counts in Redis = events (3 + flush; 4)", &|r| {
        format!(
            "{}; {}",
            if r.pipe.flush_counted_ok {
                "yes"
            } else {
                "**NO**"
            },
            if r.pipe.base_counted_ok {
                "yes"
            } else {
                "**NO**"
            }
        )
    });

    println!("\n## tally-bench results\n");
    println!(
        "`{}` × {} cores, redis-server {}; {} messages per variant over {} partitions, {} batches{}; load average {} at start, {} at end; the run took {:.0} s.\n",
        m.cpu, m.cores, m.redis, thousands(m.total as f64), m.partitions, m.compression, if m.quick { " (--quick)" } else { "" }, m.load_start, m.load_end, m.secs
    );
    println!("{t}");
    if let Some(table) = scaling_table(results) {
        println!(
            "**Scaling and merged calls** (part 2 again on the same topic: two consumer lanes in \
             one process (`kafka.consumers = 2`), two tally processes with one lane each in one \
             group, then one lane with merged calls off (`flush.max_keys_per_merged_call = 0`); \
             time starts when the first process holds its share of the partitions, so joins and \
             rebalances count; CPU and RSS summed over processes):\n"
        );
        println!("{table}");
    }
    if let Some(table) = cluster_table(results) {
        println!(
            "**Standalone vs 3-primary cluster** (part 2 on one redis-server, then on a local Redis \
             Cluster of 3 primaries without replicas, default cluster_shards; Redis CPU and keys \
             per server from INFO and SCAN on each primary):\n"
        );
        println!("{table}");
    }
    println!(
        "**Event-to-visible latency** (tally live at {} events/s, a marker event every 10 ms, Redis polled every 2 ms): \
         p50 {}, p99 {}, max {} over {} markers; flush interval {:.0} ms; flush duration p50 / p99 meanwhile {} / {}.\n",
        thousands(lat.rate), ms(lat.p50), ms(lat.p99), ms(lat.max), lat.markers, lat.interval * 1e3, ms(lat.flush_p50), ms(lat.flush_p99)
    );
    println!(
        "**Memory probe** (decoder + aggregator without Kafka): RSS {:.0} MB → {:.0} MB with {} distinct keys pending ({:.0} bytes per key); \
         peak {:.0} MB while a regular flush (capped at flush.max_keys: {} keys) is sealed and encoded as the sink does it, a chunk at a time (largest packed chunk {:.0} MB, held twice); \
         peak {:.0} MB when all of them are flushed at once, as on revoke or shutdown (largest packed chunk {:.0} MB).\n",
        mem.rss_before_mb, mem.rss_pending_mb, thousands(mem.pending as f64),
        (mem.rss_pending_mb - mem.rss_before_mb) * 1024.0 * 1024.0 / mem.pending.max(1) as f64,
        capped.hwm_mb, thousands(capped.flush_keys as f64), capped.encoded_mb, mem.hwm_mb, mem.encoded_mb
    );
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

    crate::report_targets::print_targets(m, results, mem, lat);
}
