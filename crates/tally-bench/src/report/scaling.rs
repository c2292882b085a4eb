//! The scaling table: part 2 with one lane, two lanes in one process, and two replicas (one
//! lane each) in one group, side by side on the same topic in the same run.

use super::fmt::{counted, per_million, thousands};
use crate::e2e::Shape;
use crate::results::VariantResults;

fn shape_name(s: Shape) -> String {
    if !s.merge {
        return format!(
            "{}, merged calls off",
            shape_name(Shape { merge: true, ..s })
        );
    }
    match (s.replicas, s.lanes) {
        (1, 1) => "1 process, 1 lane".into(),
        (1, l) => format!("1 process, {l} lanes"),
        (r, 1) => format!("{r} replicas, 1 lane each"),
        (r, l) => format!("{r} replicas, {l} lanes each"),
    }
}

/// One row per workload and shape, with ratios to one lane and to raw read + parse.
pub fn scaling_table(results: &[VariantResults]) -> Option<String> {
    if results.iter().all(|r| r.scaling.is_empty()) {
        return None;
    }
    let mut t = String::from(
        "| workload | tally | msgs/s end-to-end (÷ 1 lane) | msgs/s while consuming (÷ 1 lane) \
         | end-to-end ÷ raw read + parse | tally CPU-s per million msgs | consumer threads' CPU-s \
         | peak RSS (sum) | counts in Redis = events |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let raw = r.raw_parse_rate();
        let base = &r.e2e;
        let rows =
            std::iter::once((Shape::ONE, base)).chain(r.scaling.iter().map(|(s, e)| (*s, e)));
        for (shape, e) in rows {
            let consumer: f64 = e
                .threads
                .iter()
                .filter(|(n, _)| n.starts_with("tally-consumer"))
                .map(|(_, c)| c)
                .sum();
            t.push_str(&format!(
                "| {} | {} | {} ({:.2}×) | {} ({:.2}×) | {:.2} | {:.2} | {:.2} s | {:.0} MB | {} |\n",
                r.variant.name,
                shape_name(shape),
                thousands(e.messages / e.secs),
                (e.messages / e.secs) / (base.messages / base.secs),
                thousands(e.messages / e.consume_secs),
                (e.messages / e.consume_secs) / (base.messages / base.consume_secs),
                (e.messages / e.secs) / raw,
                per_million(e.cpu, e.messages),
                consumer,
                e.peak_rss_mb,
                counted(e.counted_ok),
            ));
        }
    }
    Some(t)
}
