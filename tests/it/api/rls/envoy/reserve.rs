//! Reserve → settle through a real Envoy, against check-then-charge in the same run: a stand-in
//! LLM upstream streams its answer (server-sent events, chunked) and reports the true token
//! counts in trailers at the end; the route's rate limits (the guide's snippet, read from the
//! page) reserve input and output tokens on the request (one call, two descriptors) and settle
//! them with `apply_on_stream_done` from the trailers. 64 concurrent streams each way: the
//! reserving limit is never passed (settled + reserved ≤ limit while they stream, and after),
//! check-then-charge overshoots; both counts equal what the upstream reported. Then the guide's
//! prepay → refund: each stream charged its `max_tokens` when checked, the unused part given back
//! at its end through `is_negative_hits`; the count ends equal to what the upstream reported.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitFilter};
use tally_testkit::local_redis::LocalRedis;

use crate::common::envoy_side::{guide_yaml, read_head};
use crate::common::rls::{limits_dir, Rls};

const OUT_LIMIT: i64 = 1000;
const MAX_TOKENS: u64 = 100;
const PROMPT: u64 = 50;
const STREAMS: usize = 64;

/// The guide's reserve → settle route snippet.
fn guide_snippet() -> String {
    guide_yaml("## Reserve, then settle", "typed_per_filter_config:")
}

/// The guide's Lua filter that copies the token counts from the trailers into dynamic metadata,
/// indented as an entry of `http_filters`.
fn guide_lua_filter() -> String {
    guide_yaml("## Reserve, then settle", "- name: envoy.filters.http.lua")
        .lines()
        .map(|l| format!("          {l}\n"))
        .collect()
}

/// The check-then-charge descriptor on the same route (sent only with `x-ctc-user`).
const CHARGE: &str =
    "    - actions: [{request_headers: {header_name: x-ctc-user, descriptor_key: charged}}]
      hits_addend: {number: 0}
    - actions: [{request_headers: {header_name: x-ctc-user, descriptor_key: charged}}]
      apply_on_stream_done: true
      hits_addend: {format: \"%DYNAMIC_METADATA(llm:output_tokens)%\"}
";

/// The guide's prepay → refund descriptors (`is_negative_hits`): the entries of its
/// `RateLimitPerRoute`'s `rate_limits`, keyed by `x-rf-user` (so that the other phases'
/// requests never reach them).
fn guide_prepay() -> String {
    guide_yaml("### Or prepay, then refund", "typed_per_filter_config:")
        .lines()
        .skip_while(|l| l.trim() != "rate_limits:")
        .skip(1)
        .map(|l| format!("{}\n", l.replace("x-user", "x-rf-user")))
        .collect()
}

/// The upstream: what it reported (the ground truth), and the gate that holds every stream
/// after its first event until the test opens it.
#[derive(Default)]
struct Upstream {
    /// (input, output) tokens reported in trailers, summed, per `x-user`/`x-ctc-user` value.
    reported: Mutex<std::collections::HashMap<String, (u64, u64)>>,
    open: Mutex<bool>,
    opened: Condvar,
}

fn start_upstream(up: Arc<Upstream>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let up = up.clone();
            std::thread::spawn(move || serve(conn, &up));
        }
    });
    port
}

fn serve(conn: TcpStream, up: &Upstream) {
    let mut out = conn.try_clone().unwrap();
    let mut lines = BufReader::new(conn).lines();
    loop {
        let Some(head) = read_head(&mut lines) else {
            return;
        };
        let user = ["x-user", "x-ctc-user", "x-rf-user"]
            .iter()
            .find_map(|h| head.get(*h).cloned())
            .unwrap_or_default();
        let cost: u64 = head.get("x-cost").and_then(|c| c.parse().ok()).unwrap_or(0);
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\ntrailer: x-input-tokens, x-output-tokens\r\n\r\n";
        let event = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
        if out
            .write_all(format!("{head}{}", event("data: {\"delta\":\"hel\"}\n\n")).as_bytes())
            .is_err()
        {
            return;
        }
        drop(
            up.opened
                .wait_timeout_while(up.open.lock().unwrap(), Duration::from_secs(60), |o| !*o)
                .unwrap(),
        );
        up.reported
            .lock()
            .unwrap()
            .entry(user)
            .and_modify(|(i, o)| (*i, *o) = (*i + PROMPT, *o + cost))
            .or_insert((PROMPT, cost));
        let end = format!(
            "{}0\r\nx-input-tokens: {PROMPT}\r\nx-output-tokens: {cost}\r\n\r\n",
            event("data: {\"delta\":\"lo\"}\n\n")
        );
        if out.write_all(end.as_bytes()).is_err() {
            return;
        }
    }
}

/// Envoy in front of the upstream: the guide's snippet plus the check-then-charge descriptor on
/// the route, trailers enabled from the upstream.
fn bootstrap_yaml(port: u16, admin: u16, app: u16, rls: u16) -> String {
    let route = format!("{}{CHARGE}{}", guide_snippet(), guide_prepay());
    let lines = ["route: {cluster: app, timeout: 60s}", route.as_str()];
    Bootstrap {
        app,
        rls,
        route: &lines,
        rate_limit: Some(RateLimitFilter {
            domain: "ai",
            failure_mode_deny: true,
            settings: &["timeout: 2s"],
            token: None,
        }),
        rls_tls: None,
    }
    .yaml(port, admin)
    .replace(
        "          - name: envoy.filters.http.router\n",
        &format!("{}          - name: envoy.filters.http.router\n", guide_lua_filter()),
    )
    .replace(
        "  - name: app\n    type: STATIC\n",
        "  - name: app\n    type: STATIC\n    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http_protocol_options: {enable_trailers: true}}\n",
    )
}

/// One streaming request; its status goes to `statuses` as soon as the head arrives, then the
/// stream is read to its end.
fn stream(port: u16, headers: String, statuses: mpsc::Sender<u16>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!("GET /v1/chat HTTP/1.1\r\nhost: llm\r\n{headers}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    statuses.send(code).unwrap();
    let mut rest = Vec::new();
    let _ = reader.read_to_end(&mut rest);
}

/// Fields `n` (settled) and `t` (reserved) of the one state key matching `pattern`.
fn state(redis: &LocalRedis, pattern: &str) -> (i64, i64) {
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut con).unwrap();
    let keys: Vec<&String> = keys.iter().filter(|k| !k.contains(".index:")).collect();
    assert!(keys.len() <= 1, "{pattern}: {keys:?}");
    if keys.is_empty() {
        // Nothing charged or reserved yet (a check writes no state).
        return (0, 0);
    }
    let (n, t): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
        .arg(keys[0])
        .arg("n")
        .arg("t")
        .query(&mut con)
        .unwrap();
    (n.unwrap_or(0), t.unwrap_or(0))
}

/// 64 streams at once with `header: user`; answers (admitted, settled + reserved while all
/// stream, final settled count, what the upstream reported) once every settle has landed.
fn burst(
    envoy: &Envoy,
    redis: &LocalRedis,
    up: &Arc<Upstream>,
    header: &str,
    user: &str,
    pattern: &str,
) -> (usize, i64, i64, u64) {
    *up.open.lock().unwrap() = false;
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = (0..STREAMS)
        .map(|i| {
            // True output tokens: 30..=100, never above max_tokens.
            let cost = 30 + (i as u64 * 37) % 71;
            let headers = format!(
                "{header}: {user}\r\nx-max-tokens: {MAX_TOKENS}\r\nx-prompt-tokens: {PROMPT}\r\nx-cost: {cost}\r\n"
            );
            let (port, tx) = (envoy.port, tx.clone());
            std::thread::spawn(move || stream(port, headers, tx))
        })
        .collect();
    let codes: Vec<u16> = (0..STREAMS)
        .map(|_| rx.recv_timeout(Duration::from_secs(60)).expect("a status"))
        .collect();
    let admitted = codes.iter().filter(|&&c| c == 200).count();
    assert_eq!(
        admitted + codes.iter().filter(|&&c| c == 429).count(),
        STREAMS,
        "{codes:?}: {}",
        envoy.log()
    );
    // Every admitted stream is open and holds its reservation now.
    let (n, t) = state(redis, pattern);
    let in_flight = n + t;
    *up.open.lock().unwrap() = true;
    up.opened.notify_all();
    for t in threads {
        t.join().unwrap();
    }
    let reported = up.reported.lock().unwrap().get(user).map_or((0, 0), |r| *r);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (n, t) = state(redis, pattern);
        if n == reported.1 as i64 && t == 0 {
            return (admitted, in_flight, n, reported.1);
        }
        assert!(
            Instant::now() < deadline,
            "{pattern}: n={n} t={t}, reported {reported:?}: {}",
            envoy.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_reservations_never_pass_the_limit_where_check_then_charge_does() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("envoy-reserve");
    std::fs::write(
        dir.join("ai.yaml"),
        format!(
            "domain: ai
descriptors:
  - key: tokens_in
    rate_limit: {{unit: day, requests_per_unit: 100000, reserve: {{expiry: 5m}}}}
  - key: tokens_out
    rate_limit: {{unit: day, requests_per_unit: {OUT_LIMIT}, reserve: {{expiry: 5m}}}}
  - key: charged
    rate_limit: {{unit: day, requests_per_unit: {OUT_LIMIT}, usage: true}}
  - key: prepaid
    rate_limit: {{unit: day, requests_per_unit: {OUT_LIMIT}}}
"
        ),
    )
    .unwrap();
    let rls = Rls::start(&redis, &dir, "rls-envoy-reserve");
    let _ = rls.client().await;
    let up = Arc::new(Upstream::default());
    let app = start_upstream(up.clone());
    let envoy = Envoy::start(&dir, "reserve", 2, |port, admin| {
        bootstrap_yaml(port, admin, app, rls.port)
    })
    .unwrap();
    let run = std::process::id();
    let (r_user, c_user, p_user) = (format!("r{run}"), format!("c{run}"), format!("p{run}"));
    let (redis2, envoy2, up2) = (&redis, &envoy, &up);
    let reserve = tokio::task::block_in_place(|| {
        burst(
            envoy2,
            redis2,
            up2,
            "x-user",
            &r_user,
            &format!("*tokens_out*{r_user}*"),
        )
    });
    let charge = tokio::task::block_in_place(|| {
        burst(
            envoy2,
            redis2,
            up2,
            "x-ctc-user",
            &c_user,
            &format!("*charged*{c_user}*"),
        )
    });
    // Prepay → refund: each stream charged its max_tokens when checked, the unused part given
    // back when it ends (`is_negative_hits`); burst waits until the count equals what the
    // upstream reported, which it never would without the refunds.
    let prepay = tokio::task::block_in_place(|| {
        burst(
            envoy2,
            redis2,
            up2,
            "x-rf-user",
            &p_user,
            &format!("*prepaid*{p_user}*"),
        )
    });
    eprintln!(
        "prepay → refund: {} of {STREAMS} admitted, charged while streaming {} (limit {OUT_LIMIT}), after the refunds {} = reported {}",
        prepay.0, prepay.1, prepay.2, prepay.3
    );
    assert_eq!(prepay.0 as i64, OUT_LIMIT / MAX_TOKENS as i64, "{prepay:?}");
    assert!(prepay.1 <= OUT_LIMIT, "charged past the limit: {prepay:?}");
    assert!(prepay.2 < OUT_LIMIT, "refunded: {prepay:?}");
    eprintln!(
        "reserve → settle: {} of {STREAMS} admitted, settled + reserved while streaming {} (limit {OUT_LIMIT}), settled {} = reported {}, overshoot {}",
        reserve.0, reserve.1, reserve.2, reserve.3, (reserve.2 - OUT_LIMIT).max(0)
    );
    eprintln!(
        "check-then-charge: {} of {STREAMS} admitted, charged {} = reported {}, overshoot {} ({}%)",
        charge.0,
        charge.2,
        charge.3,
        (charge.2 - OUT_LIMIT).max(0),
        (charge.2 - OUT_LIMIT).max(0) * 100 / OUT_LIMIT
    );
    assert!(
        reserve.1 <= OUT_LIMIT,
        "reserved past the limit: {reserve:?}"
    );
    assert_eq!(
        reserve.0 as i64,
        OUT_LIMIT / MAX_TOKENS as i64,
        "{reserve:?}"
    );
    assert!(reserve.2 <= OUT_LIMIT, "0 overshoot: {reserve:?}");
    assert!(
        charge.2 > OUT_LIMIT,
        "check-then-charge overshoots: {charge:?}"
    );
    // Input tokens: reserved and settled in the same calls, equal to what was reported.
    let (n_in, t_in) = state(&redis, &format!("*tokens_in*{r_user}*"));
    assert_eq!((n_in, t_in), (reserve.0 as i64 * PROMPT as i64, 0));
    assert_eq!(
        envoy.stat("cluster.app.ratelimit.error"),
        0,
        "{}",
        envoy.log()
    );
}
