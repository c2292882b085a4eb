//! TLS and mutual TLS on tally's ports: curl to the HTTP port (refused without a client
//! certificate, refused in plain HTTP, the certificate rotated by rewriting its files and a bad
//! rewrite kept out), and a real Envoy to the RLS over mutual TLS (decisions exact through it;
//! an Envoy without a client certificate refused; the certificate rotated by SIGHUP).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tally_testkit::certs::Pki;
use tally_testkit::envoy::{Bootstrap, Envoy, RateLimitFilter, RlsTls};
use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};
use tally_testkit::scrape::Scrape;
use tally_testkit::wait::wait_until;

use crate::common::process::TallyProcess;
use crate::common::rls::{limits_dir, unique};
use crate::common::terminal::{self, start_top, tmux};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files tally is configured with (copies, so they can be rewritten).
struct Served {
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl Served {
    fn new(dir: &Path, from: &Pki) -> Served {
        let served = Served {
            cert: dir.join("served.pem"),
            key: dir.join("served-key.pem"),
            client_ca: dir.join("clients-ca.pem"),
        };
        served.install(from);
        std::fs::copy(&from.ca, &served.client_ca).unwrap();
        served
    }

    /// Put `pki`'s server certificate in force on disk (written whole, then renamed).
    fn install(&self, pki: &Pki) {
        for (from, to) in [(&pki.server.cert, &self.cert), (&pki.server.key, &self.key)] {
            let tmp = to.with_extension("tmp");
            std::fs::copy(from, &tmp).unwrap();
            std::fs::rename(tmp, to).unwrap();
        }
    }

    fn toml(&self, reload: &str) -> String {
        format!(
            "tls = {{ cert_file = \"{}\", key_file = \"{}\", client_ca_file = \"{}\", reload_interval = \"{reload}\" }}",
            self.cert.display(),
            self.key.display(),
            self.client_ca.display()
        )
    }
}

/// `tally serve` on `redis` with its HTTP port served over mutual TLS (`served`, files reloaded
/// every `reload`), once it answers https with `client`'s certificate.
fn serve_https(
    redis: &LocalRedis,
    served: &Served,
    name: &str,
    reload: &str,
    client: &Pki,
) -> TallyProcess {
    let config = format!("[redis]\nurl = \"{}\"\n", redis.url());
    let tally = TallyProcess::start_command_with_http("serve", &config, name, &served.toml(reload));
    let port = tally.port;
    assert!(
        wait_until(Duration::from_secs(30), || curl(
            port,
            "/health/live",
            &client.ca,
            Some(client)
        )
        .is_some()),
        "https with a client certificate never answered; log: {}",
        tally.log()
    );
    tally
}

/// curl over HTTPS (HTTP/1.1) to `path`, trusting `ca`, with `client`'s certificate when given:
/// the body, or None when the transfer failed (TLS refused, no answer).
fn curl(port: u16, path: &str, ca: &Path, client: Option<&Pki>) -> Option<String> {
    let mut c = Command::new("curl");
    c.args(["-sS", "--fail", "--max-time", "5", "--http1.1", "--cacert"])
        .arg(ca);
    if let Some(pki) = client {
        c.arg("--cert")
            .arg(&pki.client.cert)
            .arg("--key")
            .arg(&pki.client.key);
    }
    let out = c
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a TLS handshake with the port verifies its certificate against `ca` (the client
/// certificate of `client` presented).
fn verifies(port: u16, ca: &Path, client: &Pki) -> bool {
    Command::new("openssl")
        .args(["s_client", "-brief", "-verify_return_error", "-alpn", "h2"])
        .arg("-connect")
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(ca)
        .arg("-cert")
        .arg(&client.client.cert)
        .arg("-key")
        .arg(&client.client.key)
        .stdin(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

fn metric(port: u16, pki: &Pki, name: &str) -> f64 {
    curl(port, "/metrics", &pki.ca, Some(pki))
        .and_then(|text| Scrape::parse(&text).value(name))
        .unwrap_or(0.0)
}

#[test]
fn the_http_port_over_mutual_tls_with_certificates_rotated_by_their_files() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = scratch("http");
    let (a, b) = (
        Pki::create(&dir, "a").unwrap(),
        Pki::create(&dir, "b").unwrap(),
    );
    let served = Served::new(&dir, &a);
    let tally = serve_https(&redis, &served, "tls-http", "200ms", &a);
    let port = tally.port;
    assert_eq!(
        curl(port, "/health/live", &a.ca, Some(&a)).as_deref(),
        Some("ok\n")
    );
    // Mutual TLS: no client certificate, or one of another CA, is refused in the handshake.
    assert_eq!(curl(port, "/health/live", &a.ca, None), None);
    assert_eq!(curl(port, "/health/live", &a.ca, Some(&b)), None);
    // Plain HTTP gets no answer from a TLS port.
    assert_eq!(tally_testkit::http::get(port, "/health/live"), None);
    let failed = r#"tally_tls_handshake_failures_total{port="http",reason="handshake"}"#;
    assert!(metric(port, &a, failed) >= 3.0, "{}", tally.log());

    // Rotation: b's certificate written over the files is served within the reload interval;
    // until then a client trusting only b's CA is refused.
    assert_eq!(curl(port, "/health/live", &b.ca, Some(&a)), None);
    served.install(&b);
    assert!(
        wait_until(Duration::from_secs(10), || curl(
            port,
            "/health/live",
            &b.ca,
            Some(&a)
        )
        .is_some()),
        "the rewritten certificate was not put in force; log: {}",
        tally.log()
    );
    assert_eq!(curl(port, "/health/live", &a.ca, Some(&a)), None);

    // A rewrite that does not load (a key that is not the certificate's) keeps b's in force.
    std::fs::copy(&a.server.key, &served.key).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            // The metrics over TLS with b's CA: the port still serves b's certificate.
            curl(port, "/metrics", &b.ca, Some(&a))
                .and_then(|t| {
                    Scrape::parse(&t)
                        .value(r#"tally_tls_reloads_total{port="http",result="error"}"#)
                })
                .is_some_and(|v| v >= 1.0)
        }),
        "a mismatched key was not refused; log: {}",
        tally.log()
    );
    assert_eq!(
        curl(port, "/health/live", &b.ca, Some(&a)).as_deref(),
        Some("ok\n"),
        "the certificate in force changed after a refused reload"
    );
    let log = tally.log();
    assert!(
        log.contains("http.tls"),
        "the error names the setting: {log}"
    );
}

/// A rotation that rewrites the certificate and then the key in place (no rename), 300 ms apart,
/// read every 100 ms: a read between the two finds a key that is not the certificate's, and the
/// files are read again before that counts: the new certificate is put in force, no error.
#[test]
fn certificate_and_key_rewritten_in_place_load_without_an_error() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = scratch("in-place");
    let (a, b) = (
        Pki::create(&dir, "a").unwrap(),
        Pki::create(&dir, "b").unwrap(),
    );
    let served = Served::new(&dir, &a);
    let tally = serve_https(&redis, &served, "tls-in-place", "100ms", &a);
    let port = tally.port;
    std::fs::write(&served.cert, std::fs::read(&b.server.cert).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&served.key, std::fs::read(&b.server.key).unwrap()).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || curl(
            port,
            "/health/live",
            &b.ca,
            Some(&a)
        )
        .is_some()),
        "the rewritten certificate was not put in force; log: {}",
        tally.log()
    );
    // Over b's certificate, now in force (the client's is still a's).
    let errors = curl(port, "/metrics", &b.ca, Some(&a)).and_then(|t| {
        Scrape::parse(&t).value(r#"tally_tls_reloads_total{port="http",result="error"}"#)
    });
    let log = tally.log();
    assert_eq!(errors, Some(0.0), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

#[test]
fn a_bad_certificate_file_fails_start_up_naming_the_setting() {
    let dir = scratch("bad");
    let pki = Pki::create(&dir, "bad").unwrap();
    let config_path = dir.join("tally.toml");
    std::fs::write(
        &config_path,
        format!(
            "[redis]\nurl = \"redis://127.0.0.1:1\"\n[http]\nlisten = \"127.0.0.1:{}\"\ntls = {{ cert_file = \"{}\", key_file = \"{}\" }}\n",
            free_port().unwrap(),
            pki.ca.display(),
            pki.server.key.display(),
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.tls"), "{stderr}");
}

const LIMITS: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: day, requests_per_unit: 3}
";

fn envoy(dir: &Path, name: &str, app: u16, rls: u16, tls: RlsTls) -> Envoy {
    let route = [
        "route:",
        "  cluster: app",
        "  prefix_rewrite: /health/live",
        "  rate_limits:",
        "  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]",
    ];
    let bootstrap = Bootstrap {
        app,
        rls,
        route: &route,
        rate_limit: Some(RateLimitFilter {
            domain: "edge",
            failure_mode_deny: true,
            settings: &["timeout: 2s"],
            token: None,
        }),
        rls_tls: Some(tls),
    };
    Envoy::start(dir, name, 1, |port, admin| bootstrap.yaml(port, admin)).unwrap()
}

#[test]
fn envoy_calls_the_rls_over_mutual_tls_and_one_without_a_certificate_is_refused() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = scratch("rls");
    let limits = limits_dir("tls");
    std::fs::write(limits.join("edge.yaml"), LIMITS).unwrap();
    let (a, b) = (
        Pki::create(&dir, "a").unwrap(),
        Pki::create(&dir, "b").unwrap(),
    );
    let served = Served::new(&dir, &a);
    let rls_port = free_port().unwrap();
    let config = format!(
        "[redis]\nurl = \"{}\"\n\n[rls]\nlisten = \"127.0.0.1:{rls_port}\"\nlimits_file = \"{}\"\n{}\n",
        redis.url(),
        limits.display(),
        served.toml("1h")
    );
    let tally = TallyProcess::start_command_with_http("serve", &config, "tls-rls", "");
    assert!(
        wait_until(Duration::from_secs(30), || verifies(rls_port, &a.ca, &a)),
        "the rls port never completed a mutual TLS handshake; log: {}",
        tally.log()
    );

    let with = envoy(
        &dir,
        "with-cert",
        tally.port,
        rls_port,
        RlsTls {
            ca: &a.ca,
            client: Some((&a.client.cert, &a.client.key)),
        },
    );
    let without = envoy(
        &dir,
        "without-cert",
        tally.port,
        rls_port,
        RlsTls {
            ca: &a.ca,
            client: None,
        },
    );
    let client = Client::new(Duration::from_secs(10));
    let user = unique("mtls");
    let statuses: Vec<u16> = (0..5)
        .map(|_| {
            client
                .get(with.port, "/", &[("x-user", &user)])
                .expect("envoy answers")
                .status
        })
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "exactly the limit through Envoy over mutual TLS; envoy: {}; tally: {}",
        with.log(),
        tally.log()
    );
    assert_eq!(with.stat("cluster.app.ratelimit.error"), 0);

    // Without a client certificate: the handshake is refused, Envoy's call fails, and with
    // failure_mode_deny the request is denied (500), never decided by tally.
    let other = unique("mtls-none");
    let denied = client
        .get(without.port, "/", &[("x-user", &other)])
        .expect("envoy answers")
        .status;
    assert_eq!(denied, 500, "envoy: {}", without.log());
    assert!(without.stat("cluster.app.ratelimit.error") >= 1);
    let failed = r#"tally_tls_handshake_failures_total{port="rls",reason="handshake"}"#;
    assert!(
        tally.wait_metric(failed, 1.0, Duration::from_secs(10)),
        "{}",
        tally.log()
    );
    // Nothing was charged for the refused caller.
    let keys = Command::new("redis-cli")
        .args([
            "-u",
            &redis.url(),
            "--scan",
            "--pattern",
            &format!("*{other}*"),
        ])
        .output()
        .unwrap();
    assert!(keys.status.success());
    assert!(
        keys.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&keys.stdout)
    );

    // SIGHUP puts a rewritten certificate in force (the reload interval is an hour).
    assert!(!verifies(rls_port, &b.ca, &a));
    served.install(&b);
    tally.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || verifies(rls_port, &b.ca, &a)),
        "SIGHUP did not reload the certificate; log: {}",
        tally.log()
    );
    // ...and tally is still serving (SIGHUP never stops it).
    assert!(tally.metric("tally_tls_reloads_total{port=\"rls\",result=\"ok\"}") >= Some(2.0));
}

/// `tally top` reaches an HTTPS port with mutual TLS (`--ca-file`, `--cert-file`,
/// `--key-file`): in tmux, it draws the process's status, not "unreachable".
#[test]
fn tally_top_reads_the_status_over_mutual_tls() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = scratch("top");
    let pki = Pki::create(&dir, "top").unwrap();
    let served = Served::new(&dir, &pki);
    let tally = serve_https(&redis, &served, "tls-top", "1h", &pki);
    let port = tally.port;
    let socket = format!("tally-top-tls-{}", std::process::id());
    let command = format!(
        "{} top --ca-file {} --cert-file {} --key-file {} https://127.0.0.1:{port}",
        env!("CARGO_BIN_EXE_tally"),
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    start_top(&socket, &command);
    let mut screen = String::new();
    let drawn = wait_until(Duration::from_secs(20), || {
        screen = terminal::screen(&socket);
        screen.contains(&format!("https://127.0.0.1:{port}"))
            && screen.contains("serve")
            && screen.contains("ready")
    });
    // Killing its terminal (an SSH session closing) sends SIGHUP: tally top must end, not spin.
    tmux(&socket, &["kill-server"]);
    assert!(drawn && !screen.contains("unreachable"), "{screen}");
    let mine = pki.ca.display().to_string();
    let running = || {
        Command::new("pgrep")
            .args(["-f", &mine])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    };
    let gone = wait_until(Duration::from_secs(10), || !running());
    if !gone {
        let _ = Command::new("pkill").args(["-9", "-f", &mine]).status();
    }
    assert!(gone, "tally top outlived its terminal");
}
