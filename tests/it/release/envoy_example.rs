//! `deploy/envoy/` (Envoy + tally + Redis) starts as written and limits as its files say: the
//! only changes are the ports (free ones instead of 6379, 8081, 9100, 10000, 9901) and the limits
//! folder's path (absolute, since the test does not run from the repository's root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tally_testkit::envoy::Envoy;
use tally_testkit::http::Client;
use tally_testkit::local_redis::{free_port, LocalRedis};
use tally_testkit::wait::wait_until;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy")
}

/// `tally serve`, killed when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_envoy_example_stack_starts_as_written_and_limits_each_user() {
    let dir = std::env::temp_dir().join(format!("tally-envoy-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (redis_port, rls_port, http_port) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let redis = LocalRedis::start_on(redis_port, &[]).expect("redis-server");

    let toml = std::fs::read_to_string(example().join("tally.toml")).unwrap();
    let edits = [
        ("127.0.0.1:6379", format!("127.0.0.1:{redis_port}")),
        ("127.0.0.1:8081", format!("127.0.0.1:{rls_port}")),
        ("127.0.0.1:9100", format!("127.0.0.1:{http_port}")),
        (
            "\"deploy/envoy/limits\"",
            format!("{:?}", example().join("limits").display().to_string()),
        ),
    ];
    let mut config = toml.clone();
    for (from, to) in &edits {
        assert!(config.contains(from), "tally.toml holds {from}");
        config = config.replace(from, to);
    }
    let config_path = dir.join("tally.toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(dir.join("tally.log")).unwrap();
    let _serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["serve", "--config"])
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tally serve"),
    );
    let tally_log = || std::fs::read_to_string(dir.join("tally.log")).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(30), || tally_log()
            .contains("serving envoy's rate limit service")),
        "tally serve did not start the RLS:\n{}",
        tally_log()
    );

    let yaml = std::fs::read_to_string(example().join("envoy.yaml")).unwrap();
    let envoy = Envoy::start(&dir, "example", 1, |port, admin| {
        let mut y = yaml.clone();
        for (from, to) in [
            ("port_value: 9901}", admin),
            ("port_value: 10000}", port),
            ("port_value: 8081}", rls_port),
            ("port_value: 9100}", http_port),
        ] {
            assert!(y.contains(from), "envoy.yaml holds {from}");
            y = y.replace(from, &format!("port_value: {to}}}"));
        }
        y
    })
    .expect("envoy starts with deploy/envoy/envoy.yaml");

    // The limits file says 3 a minute per x-user value: alice gets 3, then 429s (with Envoy's
    // rate-limited header); bob is counted apart.
    let client = Client::default();
    let get = |user: &str| {
        client
            .get(envoy.port, "/", &[("x-user", user)])
            .expect("envoy answers")
    };
    let alice: Vec<u16> = (0..5).map(|_| get("alice").status).collect();
    assert_eq!(alice, [200, 200, 200, 429, 429], "{}", envoy.log());
    let denied = get("alice");
    assert_eq!(
        denied.header("x-envoy-ratelimited"),
        Some("true"),
        "{denied:?}"
    );
    assert_eq!(get("bob").status, 200);
    drop(envoy);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
