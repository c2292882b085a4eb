//! `tally top [URL…]`: the live status of one or several tally processes in the terminal, drawn
//! from their `GET /v1/status` every interval (ratatui over crossterm; works over SSH). Each URL
//! is polled by its own thread, so a slow instance does not hold the others up. An instance that
//! stops answering keeps its last status on screen, marked `STALE since` with the reason. `s`
//! sorts the partitions by lag (the default) or by number; `q`, Esc or Ctrl-C quits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use parking_lot::Mutex;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline, Wrap};
use ratatui::Frame;
use serde_json::Value;

/// What one instance last answered.
struct Instance {
    url: String,
    last: Mutex<Last>,
}

/// The last good status (and when it came), and the error since, if any.
#[derive(Default)]
struct Last {
    good: Option<(Value, chrono::DateTime<chrono::Utc>)>,
    error: Option<String>,
}

/// Partitions sorted by lag (largest first) or by number.
static BY_NUMBER: AtomicBool = AtomicBool::new(false);

/// Poll `urls` every `every` and draw them until the user quits.
pub fn run(
    urls: Vec<String>,
    (token, tls): (Option<String>, ureq::tls::TlsConfig),
    every: Duration,
    // SIGTERM, SIGINT, or SIGHUP: the terminal went away (an SSH session closed).
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let instances: Vec<Arc<Instance>> = urls
        .into_iter()
        .map(|url| {
            Arc::new(Instance {
                url: url.trim_end_matches('/').to_string(),
                last: Mutex::new(Last {
                    good: None,
                    error: Some("connecting…".into()),
                }),
            })
        })
        .collect();
    for instance in &instances {
        let (instance, stop, token) = (instance.clone(), stop.clone(), token.clone());
        let tls = tls.clone();
        std::thread::Builder::new()
            .name("tally-top".into())
            .spawn(move || poll(&instance, (token.as_deref(), tls), every, &stop))?;
    }
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            terminal.draw(|f| draw(f, &instances))?;
            if event::poll(Duration::from_millis(250))? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc);
                    if k.kind == KeyEventKind::Press && (quit || ctrl_c) {
                        return Ok(());
                    }
                    if k.kind == KeyEventKind::Press && k.code == KeyCode::Char('s') {
                        BY_NUMBER.fetch_xor(true, Ordering::Relaxed);
                    }
                }
            }
        }
    })();
    ratatui::restore();
    stop.store(true, Ordering::Relaxed);
    result
}

/// Fetch `instance`'s status every `every` until `stop`.
fn poll(
    instance: &Instance,
    (token, tls): (Option<&str>, ureq::tls::TlsConfig),
    every: Duration,
    stop: &AtomicBool,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let url = format!("{}/v1/status", instance.url);
    while !stop.load(Ordering::Relaxed) {
        let mut request = agent.get(&url);
        if let Some(t) = token {
            request = request.header("Authorization", &format!("Bearer {t}"));
        }
        let answer = match request.call() {
            Ok(mut r) if r.status() == 200 => r
                .body_mut()
                .with_config()
                .limit(4 << 20)
                .read_json::<Value>()
                .map_err(|e| format!("unreadable answer: {e}")),
            Ok(r) if r.status() == 401 => {
                Err("401: pass the token with TALLY_TOKEN or --token-file".into())
            }
            Ok(r) => Err(format!("answer {}", r.status())),
            Err(e) => Err(format!("unreachable: {e}")),
        };
        let mut last = instance.last.lock();
        match answer {
            Ok(status) => {
                last.good = Some((status, chrono::Utc::now()));
                last.error = None;
            }
            Err(e) => last.error = Some(e),
        }
        drop(last);
        std::thread::sleep(every);
    }
}

fn draw(f: &mut Frame, instances: &[Arc<Instance>]) {
    let area = f.area();
    let [body, help] = Layout::vertical([Constraint::Min(1), Constraint::Length(1)]).areas(area);
    let rows = Layout::vertical(vec![
        Constraint::Ratio(1, instances.len().max(1) as u32);
        instances.len()
    ])
    .split(body);
    for (instance, rect) in instances.iter().zip(rows.iter()) {
        draw_instance(f, instance, *rect);
    }
    f.render_widget(
        Paragraph::new("s: sort partitions (lag / number)   q / Esc / Ctrl-C: quit")
            .style(Style::new().fg(Color::DarkGray)),
        help,
    );
}

fn draw_instance(f: &mut Frame, instance: &Instance, rect: Rect) {
    let last = instance.last.lock();
    let Some((s, at)) = &last.good else {
        let block = Block::default()
            .borders(Borders::ALL)
            .title(instance.url.clone());
        let text = Paragraph::new(last.error.clone().unwrap_or_default())
            .style(Style::new().fg(Color::Red))
            .block(block);
        f.render_widget(text, rect);
        return;
    };
    let mut title = header(&instance.url, s);
    if let Some(e) = &last.error {
        // The figures below stopped: say so, with why, rather than show them as live.
        title.push(Span::styled(
            format!(" STALE since {}: {e} ", at.format("%H:%M:%SZ")),
            Style::new().fg(Color::White).bg(Color::Red),
        ));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Line::from(title));
    let inner = block.inner(rect);
    f.render_widget(block, rect);
    let stream = &s["stream"];
    if stream.is_null() {
        f.render_widget(Paragraph::new(requests_and_jobs(s)), inner);
        return;
    }
    let [sparks, rest] = Layout::vertical([Constraint::Length(4), Constraint::Min(1)]).areas(inner);
    let [consumed, flushed] =
        Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(sparks);
    spark(
        f,
        consumed,
        "consumed/s",
        stream["consumed_per_s"].as_f64(),
        &stream["sparklines"]["consumed"],
    );
    spark(
        f,
        flushed,
        "flushed keys/s",
        stream["flushed_keys_per_s"].as_f64(),
        &stream["sparklines"]["flushed_keys"],
    );
    let [left, right] =
        Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(rest);
    let mut lines = stream_lines(stream);
    lines.extend(requests_and_jobs(s));
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), left);
    f.render_widget(Paragraph::new(hot_lines(stream)), right);
}

/// `url  run  ready  kafka up  redis up  up 12s  host (pid) tally 0.2.0 (commit) group/topic`:
/// health in words (the colours only repeat them).
fn header<'a>(url: &str, s: &Value) -> Vec<Span<'a>> {
    let flag = |v: &Value, yes: &str, no: &str| -> Span<'a> {
        match v.as_bool() {
            Some(true) => Span::styled(
                format!(" {yes} "),
                Style::new().fg(Color::Black).bg(Color::Green),
            ),
            Some(false) => Span::styled(
                format!(" {no} "),
                Style::new().fg(Color::White).bg(Color::Red),
            ),
            None => Span::raw(""),
        }
    };
    let id = &s["instance"];
    let consuming = match (id["group"].as_str(), id["topic"].as_str()) {
        (Some(g), Some(t)) => format!(" group {g} topic {t}"),
        _ => String::new(),
    };
    vec![
        Span::styled(
            format!(" {url} "),
            Style::new().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!("{} ", s["mode"].as_str().unwrap_or("?"))),
        flag(&s["health"]["ready"], "ready", "NOT READY"),
        Span::raw(" "),
        flag(&s["health"]["kafka"], "kafka up", "kafka UNREACHABLE"),
        Span::raw(" "),
        flag(&s["health"]["redis"], "redis up", "redis UNREACHABLE"),
        Span::raw(format!(
            " up {}s  {} (pid {}) tally {} ({}){consuming} ",
            s["uptime_s"].as_u64().unwrap_or(0),
            id["host"].as_str().unwrap_or("?"),
            number(&id["pid"]),
            id["version"].as_str().unwrap_or("?"),
            id["commit"].as_str().unwrap_or("?"),
        )),
    ]
}

fn spark(f: &mut Frame, rect: Rect, name: &str, rate: Option<f64>, series: &Value) {
    let data: Vec<u64> = series
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    // The newest seconds fit the width.
    let width = rect.width.saturating_sub(2) as usize;
    let data = &data[data.len().saturating_sub(width)..];
    let title = format!("{name} {:.0}", rate.unwrap_or(0.0));
    let widget = Sparkline::default()
        .block(Block::default().borders(Borders::ALL).title(title))
        .data(data)
        .style(Style::new().fg(Color::Cyan));
    f.render_widget(widget, rect);
}

fn number(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.1}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A Unix-ms time as `HH:MM:SSZ` (UTC), or `-`.
fn time_of_day(v: &Value) -> String {
    match v.as_i64() {
        Some(ms) => {
            let s = ms.div_euclid(1000).rem_euclid(86_400);
            format!("{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
        }
        None => "-".into(),
    }
}

fn stream_lines(stream: &Value) -> Vec<Line<'static>> {
    let latency = &stream["flush_latency_ms"];
    let mut lines = vec![
        Line::from(format!(
            "lag {}   flush p50 {} ms  p99 {} ms   flushes/s {}",
            number(&stream["lag"]),
            number(&latency["p50"]),
            number(&latency["p99"]),
            number(&stream["flushes_per_s"]),
        )),
        Line::from(format!(
            "totals: consumed {}  flushed keys {}   not counted: invalid {}  late {}",
            number(&stream["totals"]["consumed"]),
            number(&stream["totals"]["flushed_keys"]),
            number(&stream["totals"]["invalid"]),
            number(&stream["totals"]["late"]),
        )),
    ];
    let mut parts = stream["partitions"].as_array().cloned().unwrap_or_default();
    if !BY_NUMBER.load(Ordering::Relaxed) {
        parts.sort_by_key(|p| std::cmp::Reverse(p["lag"].as_i64().unwrap_or(0)));
    }
    // With several topics, a partition is named `topic/number`.
    let topics: std::collections::BTreeSet<&str> =
        parts.iter().filter_map(|p| p["topic"].as_str()).collect();
    let several = topics.len() > 1;
    partition_lines(&parts, several, &mut lines);
    for o in stream["outputs"].as_array().into_iter().flatten() {
        lines.push(Line::from(format!(
            "output {}: closed up to {}",
            o["counter"].as_str().unwrap_or("?"),
            time_of_day(&o["watermark"]),
        )));
    }
    for h in stream["halted"].as_array().into_iter().flatten() {
        halted_lines(h, several, &mut lines);
    }
    lines
}

/// A partition's name: `topic/number` when `several` topics are shown, else its number.
fn partition_name(p: &Value, several: bool) -> String {
    match several {
        true => format!(
            "{}/{}",
            p["topic"].as_str().unwrap_or("?"),
            number(&p["partition"])
        ),
        false => number(&p["partition"]),
    }
}

/// The partitions' table, then their event-time watermarks.
fn partition_lines(parts: &[Value], several: bool, lines: &mut Vec<Line<'static>>) {
    lines.push(Line::styled(
        "partition  lane     applied         end      lag  oldest  state",
        Style::new().add_modifier(Modifier::BOLD),
    ));
    for p in parts {
        let age = p["lag_seconds"]
            .as_f64()
            .map_or("-".to_string(), |a| format!("{a:.1}s"));
        lines.push(Line::from(format!(
            "{:>9}  {:>4}  {:>10}  {:>10}  {:>7}  {:>6}  {}",
            partition_name(p, several),
            number(&p["lane"]),
            number(&p["applied"]),
            number(&p["end"]),
            number(&p["lag"]),
            age,
            if p["halted"].as_bool() == Some(true) {
                "halted"
            } else {
                "counting"
            },
        )));
    }
    // Event-time watermarks: on the replica that leads the window publisher.
    let marks: Vec<String> = parts
        .iter()
        .filter(|p| !p["idle"].is_null())
        .map(|p| {
            let at = if p["idle"].as_bool() == Some(true) {
                "idle".to_string()
            } else {
                time_of_day(&p["watermark"])
            };
            format!("p{}:{at}", partition_name(p, several))
        })
        .collect();
    if !marks.is_empty() {
        lines.push(Line::from(format!("watermark  {}", marks.join(" "))));
    }
}

/// A halted partition: why, in red, and how it resumes.
fn halted_lines(h: &Value, several: bool, lines: &mut Vec<Line<'static>>) {
    let red = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
    lines.push(Line::styled(
        format!(
            "HALTED partition {} ({})",
            partition_name(h, several),
            h["reason"].as_str().unwrap_or("?")
        ),
        red,
    ));
    let fix = match h["repair"].as_str() {
        Some(cmd) => format!("  repair: {cmd}"),
        None => "  waiting: resumes by itself".into(),
    };
    lines.push(Line::styled(fix, Style::new().fg(Color::Yellow)));
}

fn hot_lines(stream: &Value) -> Vec<Line<'static>> {
    let hot = &stream["hot_keys"];
    if hot.is_null() {
        return vec![Line::from("hot keys: off")];
    }
    let mut lines = vec![Line::styled(
        format!("hot keys (± {})", number(&hot["error_bound"])),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    for k in hot["keys"].as_array().into_iter().flatten() {
        lines.push(Line::from(format!(
            "{:>10}  {}",
            number(&k["count"]),
            k["key"].as_str().unwrap_or("")
        )));
    }
    lines
}

fn requests_and_jobs(s: &Value) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    for p in s["requests"].as_array().into_iter().flatten() {
        lines.push(Line::from(format!(
            "limit {}: admitted {} denied {} without redis {}",
            p["policy"].as_str().unwrap_or("?"),
            number(&p["admitted"]),
            number(&p["denied"]),
            number(&p["without_redis"]),
        )));
    }
    for j in s["jobs"].as_array().into_iter().flatten() {
        lines.push(Line::from(format!(
            "job {}: {} runs {}{}",
            j["job"].as_str().unwrap_or("?"),
            if j["leader"].as_bool() == Some(true) {
                "leader"
            } else {
                "follower"
            },
            number(&j["runs"]),
            j["last_error"]
                .as_str()
                .map(|e| format!(" (last failed: {e})"))
                .unwrap_or_default(),
        )));
    }
    lines
}
