//! Redis with AUTH (an ACL user) and over TLS with a private CA: tally connects and counts
//! exactly.

use std::time::Duration;

use crate::common::{hourly, wait_for, Harness};
use chrono::Utc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_auth_with_acl_user_and_password() {
    let mut h = Harness::with_redis(
        "auth",
        1,
        &[
            "--requirepass",
            "s3cret",
            "--user",
            "tally",
            "on",
            ">tallypw",
            "~*",
            "+@all",
        ],
    );
    let mut config = h.config("g-auth", hourly("auth"));
    config.redis.username = Some("tally".into());
    config.redis.password = Some("tallypw".into());
    let now = Some(Utc::now().timestamp_millis());
    for i in 0..100 {
        h.produce(
            0,
            format!(r#"{{"app_id":"a","device_id":"d{}"}}"#, i % 10).as_bytes(),
            now,
        );
    }
    h.flush_producer();
    let running = h.start(config);
    let mut admin =
        redis::Client::open(format!("redis://default:s3cret@127.0.0.1:{}", h.redis.port))
            .unwrap()
            .get_connection()
            .unwrap();
    let key = "tally:applied:g-auth:auth:0:0";
    wait_for("applied with ACL user", Duration::from_secs(60), || {
        redis::cmd("GET")
            .arg(key)
            .query::<Option<i64>>(&mut admin)
            .ok()
            .flatten()
            == Some(100)
    })
    .await;
    running.stop().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("auth:*").query(&mut admin).unwrap();
    let sum: i64 = keys
        .iter()
        .map(|k| redis::cmd("GET").arg(k).query::<i64>(&mut admin).unwrap())
        .sum();
    assert_eq!(sum, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca() {
    // A self-signed CA/server certificate made here, and a TLS-only redis-server.
    let dir = std::env::temp_dir().join(format!("tally-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let port = tally_testkit::local_redis::free_port().unwrap();
    let server = std::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-port")
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&cert)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _guard = Kill(server);

    let mut h = Harness::new("tls", 1);
    let mut config = h.config("g-tls", hourly("tls"));
    config.redis.url = format!("rediss://127.0.0.1:{port}");
    config.redis.tls_ca_file = Some(cert.clone());
    let now = Some(Utc::now().timestamp_millis());
    for i in 0..50 {
        h.produce(
            0,
            format!(r#"{{"app_id":"a","device_id":"d{}"}}"#, i % 5).as_bytes(),
            now,
        );
    }
    h.flush_producer();
    let running = h.start(config.clone());
    let client = tally::stream::sink::client(&config.redis).unwrap();
    let mut conn = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if conn.is_none() {
            conn = client.get_multiplexed_async_connection().await.ok();
        }
        if let Some(c) = conn.as_mut() {
            let applied: Option<i64> = redis::cmd("GET")
                .arg("tally:applied:g-tls:tls:0:0")
                .query_async(c)
                .await
                .unwrap_or(None);
            if applied == Some(50) {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tally never wrote over TLS"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let c = conn.as_mut().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tls:*")
        .query_async(c)
        .await
        .unwrap();
    let mut sum = 0;
    for k in keys {
        sum += redis::cmd("GET")
            .arg(k)
            .query_async::<i64>(c)
            .await
            .unwrap();
    }
    assert_eq!(sum, 50);
    let _ = std::fs::remove_dir_all(&dir);
}
