//! Three sentinels (`redis-server --sentinel`) on loopback watching one primary as `mymaster`:
//! down after 1 s, failover timeout 3 s.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tally_testkit::local_redis::free_port;

use super::replica::cli;

/// The sentinels, killed on drop.
pub struct Sentinels {
    children: Vec<Child>,
    /// Their ports.
    pub ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl Sentinels {
    /// Three sentinels monitoring the primary on `primary`, which has `replicas` replicas;
    /// returns once every sentinel knows the replicas and the other sentinels.
    pub fn start(primary: u16, replicas: u32) -> Sentinels {
        let dir =
            std::env::temp_dir().join(format!("tally-sentinel-{}-{primary}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
        let mut children = Vec::new();
        for port in &ports {
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary} 2\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 3000\n",
                    dir.display()
                ),
            )
            .unwrap();
            children.push(
                Command::new("redis-server")
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        let sentinels = Sentinels {
            children,
            ports,
            dir,
        };
        wait_until("sentinels ready", Duration::from_secs(30), || {
            sentinels.ports.iter().all(|s| {
                let info = cli(*s, &["SENTINEL", "master", "mymaster"]);
                let field = |name: &str| {
                    let lines: Vec<&str> = info.lines().collect();
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1))
                        .and_then(|v| v.parse::<u32>().ok())
                };
                field("num-slaves") == Some(replicas) && field("num-other-sentinels") == Some(2)
            })
        });
        sentinels
    }

    /// The primary's port as the first sentinel names it.
    pub fn primary(&self) -> Option<u16> {
        let out = cli(
            self.ports[0],
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Every sentinel names `primary` and sees it up, with no failover in progress.
    pub fn switched(&self, primary: u16) -> bool {
        self.ports.iter().all(|s| {
            let named = cli(*s, &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
            let info = cli(*s, &["SENTINEL", "master", "mymaster"]);
            let lines: Vec<&str> = info.lines().collect();
            let flags = lines.windows(2).find(|w| w[0] == "flags").map(|w| w[1]);
            named.lines().nth(1).map(str::trim) == Some(&primary.to_string())
                && flags == Some("master")
        })
    }

    /// Every sentinel names `primary`, sees it up with `replicas` replicas up, and no failover is
    /// in progress: a new failure now is handled as the first one was.
    pub fn settled(&self, primary: u16, replicas: u32) -> bool {
        self.ports.iter().all(|s| {
            let named = cli(*s, &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
            let info = cli(*s, &["SENTINEL", "master", "mymaster"]);
            let lines: Vec<&str> = info.lines().collect();
            let field = |name: &str| {
                lines
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| lines.get(i + 1))
                    .copied()
            };
            let replicas_info = cli(*s, &["SENTINEL", "replicas", "mymaster"]);
            let replica_lines: Vec<&str> = replicas_info.lines().collect();
            // Replicas whose flags are just `slave` (not down, not disconnected).
            let up = replica_lines
                .windows(2)
                .filter(|w| w[0] == "flags" && w[1] == "slave")
                .count();
            named.lines().nth(1).map(str::trim) == Some(&primary.to_string())
                && field("flags") == Some("master")
                && field("num-slaves").and_then(|v| v.parse().ok()) == Some(replicas)
                && up as u32 == replicas
        })
    }

    /// What each sentinel says of the primary and its replicas, for a failure message.
    pub fn describe(&self) -> String {
        self.ports
            .iter()
            .map(|s| {
                let ask = |what: &str| cli(*s, &["SENTINEL", what, "mymaster"]).replace('\n', " ");
                format!(
                    "sentinel {s}: master [{}] replicas [{}]",
                    ask("master"),
                    ask("replicas")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The `[redis]` section reaching the primary through these sentinels.
    pub fn redis_toml(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|s| format!("\"redis://127.0.0.1:{s}\""))
            .collect();
        format!(
            "[redis]\nmode = \"sentinel\"\nsentinels = [{}]\nmaster_name = \"mymaster\"\n",
            urls.join(", ")
        )
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Poll `cond` every 20 ms; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
