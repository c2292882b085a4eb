//! The `--cluster` table: part 2 on one `redis-server` and on a 3-primary cluster, side by side.

use super::fmt::{counted, ms, per_million, rate, thousands};
use crate::e2e::E2e;
use crate::results::VariantResults;

/// One row per workload and deployment, then their ratio; `None` without `--cluster`.
pub fn cluster_table(results: &[VariantResults]) -> Option<String> {
    let mut t = String::from(
        "| workload | Redis | msgs/s end-to-end | msgs/s while consuming | tally CPU-s per million msgs \
         | Redis CPU-s per million msgs: sum (per server) | flush p50 / p99 | flushes; script calls per million msgs \
         | counter keys per server | peak RSS; most keys pending | counts in Redis = events |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let cluster = r.cluster.as_ref()?;
        let name = r.variant.name;
        t.push_str(&row(name, "standalone", &r.e2e));
        t.push_str(&row(name, "3-primary cluster", cluster));
        t.push_str(&ratio_row(name, &r.e2e, cluster));
    }
    t.push('\n');
    for r in results {
        let c = r.cluster.as_ref()?;
        let top: Vec<String> = c
            .threads
            .iter()
            .take(6)
            .map(|(n, cpu)| format!("{n} {cpu:.2} s"))
            .collect();
        t.push_str(&format!(
            "\n**tally's CPU by thread, cluster** ({}: {:.2} s for {} msgs): {}\n",
            r.variant.name,
            c.cpu,
            thousands(c.messages),
            top.join(", ")
        ));
    }
    Some(t)
}

fn row(workload: &str, redis: &str, e: &E2e) -> String {
    let per_server: Vec<String> = e
        .redis_cpu_per_server
        .iter()
        .map(|c| format!("{:.2}", per_million(*c, e.messages)))
        .collect();
    let keys: Vec<String> = e
        .keys_per_server
        .iter()
        .map(|k| thousands(*k as f64))
        .collect();
    format!(
        "| {workload} | {redis} | {} | {} | {:.2} | {:.2} ({}) | {} / {} | {}; {} | {} | {:.0} MB; {} | {} |\n",
        rate(e.messages, e.secs),
        rate(e.messages, e.consume_secs),
        per_million(e.cpu, e.messages),
        per_million(e.redis.cpu, e.messages),
        per_server.join(" / "),
        ms(e.flush_p50),
        ms(e.flush_p99),
        e.flushes,
        thousands(per_million(e.redis.calls_of("evalsha"), e.messages)),
        keys.join(" / "),
        e.peak_rss_mb,
        thousands(e.max_pending),
        counted(e.counted_ok),
    )
}

/// cluster ÷ standalone of every figure that has a ratio.
fn ratio_row(workload: &str, s: &E2e, c: &E2e) -> String {
    let x = |a: f64, b: f64| {
        let r = a / b;
        if r.is_finite() {
            format!("{r:.2}×")
        } else {
            "n/a".into()
        }
    };
    format!(
        "| {workload} | **cluster ÷ standalone** | {} | {} | {} | {} | {} / {} | {}; {} | | {} | |\n",
        x(c.messages / c.secs, s.messages / s.secs),
        x(c.messages / c.consume_secs, s.messages / s.consume_secs),
        x(c.cpu / c.messages, s.cpu / s.messages),
        x(c.redis.cpu / c.messages, s.redis.cpu / s.messages),
        x(c.flush_p50, s.flush_p50),
        x(c.flush_p99, s.flush_p99),
        x(c.flushes, s.flushes),
        x(
            c.redis.calls_of("evalsha") / c.messages,
            s.redis.calls_of("evalsha") / s.messages
        ),
        x(c.peak_rss_mb, s.peak_rss_mb),
    )
}
