//! Prometheus' text exposition format, read into samples, and one scrape of a `/metrics`
//! endpoint. Tests look a sample up by the text they would write in a query,
//! `tally_job_leader{task="ttl_audit"}`: the same name and the same labels, in any order.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::http::Client;

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// What one exposition holds: its samples and the families its `# TYPE` lines declare.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// Family name → type (`counter`, `gauge`, `histogram`, ...).
    pub families: BTreeMap<String, String>,
}

impl Scrape {
    /// Read an exposition; lines that are not samples or `# TYPE` are skipped.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                    scrape.families.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#') {
                scrape.samples.extend(parse_sample(line));
            }
        }
        scrape
    }

    /// GET `/metrics` on 127.0.0.1:`port`; None if nothing answers within `timeout` or the
    /// answer is not a 200.
    pub fn get(port: u16, timeout: Duration) -> Option<Scrape> {
        let answer = Client::new(timeout).get(port, "/metrics", &[]).ok()?;
        (answer.status == 200).then(|| Scrape::parse(&answer.body))
    }

    /// The value of the sample `selector` names: `name` or `name{a="x",b="y"}`, with exactly
    /// those labels.
    pub fn value(&self, selector: &str) -> Option<f64> {
        let (name, labels) = parse_series(selector)?;
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == labels)
            .map(|s| s.value)
    }
}

/// `name{labels} value [timestamp]`.
fn parse_sample(line: &str) -> Option<Sample> {
    let series_end = match line.find('{') {
        Some(_) => line.rfind('}')? + 1,
        None => line.find(char::is_whitespace)?,
    };
    let (name, labels) = parse_series(&line[..series_end])?;
    let value = line[series_end..].split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `name` or `name{a="x",b="y"}` (values with `\"`, `\\` and `\n` escapes).
fn parse_series(text: &str) -> Option<(String, BTreeMap<String, String>)> {
    let text = text.trim();
    let Some((name, rest)) = text.split_once('{') else {
        return Some((text.to_string(), BTreeMap::new()));
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.strip_suffix('}')?.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let label: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if chars.next() != Some('=') || chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        }
        labels.insert(label.trim().to_string(), value);
    }
    Some((name.trim().to_string(), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tally_job_leader 1 while this replica leads the job.
# TYPE tally_job_leader gauge
tally_job_leader{task="ttl_audit"} 1
tally_job_leader{task="other"} 0
# TYPE tally_pending_keys gauge
tally_pending_keys 42
# TYPE tally_flush_duration_seconds histogram
tally_flush_duration_seconds_bucket{le="0.005"} 3
tally_flush_duration_seconds_bucket{le="+Inf"} 7
tally_flush_duration_seconds_count 7
odd{path="a \"quoted\", \\ and\nline",b="2"} 1.5e3 1700000000000
"#;

    #[test]
    fn samples_are_found_by_name_and_exact_labels() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.value(r#"tally_job_leader{task="ttl_audit"}"#), Some(1.0));
        assert_eq!(s.value(r#"tally_job_leader{task="other"}"#), Some(0.0));
        assert_eq!(s.value("tally_job_leader"), None, "labels must match");
        assert_eq!(s.value("tally_pending_keys"), Some(42.0));
        assert_eq!(s.value("tally_flush_duration_seconds_count"), Some(7.0));
        assert_eq!(
            s.value(r#"tally_flush_duration_seconds_bucket{le="+Inf"}"#),
            Some(7.0)
        );
        assert_eq!(
            s.value(r#"odd{b="2",path="a \"quoted\", \\ and\nline"}"#),
            Some(1500.0),
            "labels in any order, escapes read"
        );
        assert_eq!(s.value("absent"), None);
    }

    #[test]
    fn type_lines_name_the_families() {
        let s = Scrape::parse(TEXT);
        let families: Vec<&str> = s.families.keys().map(String::as_str).collect();
        assert_eq!(
            families,
            [
                "tally_flush_duration_seconds",
                "tally_job_leader",
                "tally_pending_keys"
            ]
        );
        assert_eq!(s.families["tally_flush_duration_seconds"], "histogram");
    }
}
