//! Three sentinels (`redis-server --sentinel`) on loopback watching one primary as `mymaster`:
//! down after 1 s, failover timeout 3 s.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
        let sentinels = Sentinels::spawn(&[primary; 3], 2);
        wait_until("sentinels ready", Duration::from_secs(30), || {
            sentinels.ports.iter().all(|s| {
                let master = cli(*s, &["SENTINEL", "master", "mymaster"]);
                field(&master, "num-slaves") == Some(&replicas.to_string())
                    && field(&master, "num-other-sentinels") == Some("2")
            })
        });
        sentinels
    }

    /// One sentinel per entry of `primaries`, each alone (quorum 1) watching its own server as
    /// `mymaster`: sentinels that disagree, as one cut off from the others during a failover does.
    pub fn each_alone(primaries: &[u16]) -> Sentinels {
        let sentinels = Sentinels::spawn(primaries, 1);
        wait_until("sentinels ready", Duration::from_secs(30), || {
            sentinels.ports.iter().all(|s| {
                let master = cli(*s, &["SENTINEL", "master", "mymaster"]);
                field(&master, "flags") == Some("master")
            })
        });
        sentinels
    }

    fn spawn(primaries: &[u16], quorum: u32) -> Sentinels {
        let dir = std::env::temp_dir().join(format!(
            "tally-sentinel-{}-{}",
            std::process::id(),
            primaries[0]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = primaries.iter().map(|_| free_port().unwrap()).collect();
        let mut children = Vec::new();
        for (port, primary) in ports.iter().zip(primaries) {
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary} {quorum}\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 3000\n",
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
        Sentinels {
            children,
            ports,
            dir,
        }
    }

    /// The configuration epoch sentinel `i` has for `mymaster`.
    pub fn epoch(&self, i: usize) -> Option<u64> {
        let master = cli(self.ports[i], &["SENTINEL", "master", "mymaster"]);
        field(&master, "config-epoch")?.parse().ok()
    }

    /// Stop (SIGSTOP) sentinel `i`: it keeps its port open and answers nothing, as a sentinel
    /// on a frozen VM or a stalled host does. Killed (frozen or not) on drop.
    pub fn freeze(&self, i: usize) {
        super::replica::signal(self.children[i].id(), "-STOP");
    }

    /// The primary's port as the first sentinel names it.
    pub fn primary(&self) -> Option<u16> {
        let out = cli(
            self.ports[0],
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// Some sentinel names `primary` (the first to switch is the one that led the failover).
    pub fn names(&self, primary: u16) -> bool {
        self.ports.iter().any(|s| {
            let named = cli(*s, &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
            named.lines().nth(1).map(str::trim) == Some(&primary.to_string())
        })
    }

    /// Every sentinel names `primary` and sees it up, with no failover in progress.
    pub fn switched(&self, primary: u16) -> bool {
        self.ports.iter().all(|s| {
            let named = cli(*s, &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
            let master = cli(*s, &["SENTINEL", "master", "mymaster"]);
            named.lines().nth(1).map(str::trim) == Some(&primary.to_string())
                && field(&master, "flags") == Some("master")
        })
    }

    /// [`Sentinels::switched`] to `primary`, and every sentinel sees `replicas` replicas, all
    /// up (flags just `slave`): a new failure now is handled as the first one was.
    pub fn settled(&self, primary: u16, replicas: u32) -> bool {
        self.switched(primary)
            && self.ports.iter().all(|s| {
                let master = cli(*s, &["SENTINEL", "master", "mymaster"]);
                let listed = cli(*s, &["SENTINEL", "replicas", "mymaster"]);
                let lines: Vec<&str> = listed.lines().collect();
                let up = lines
                    .windows(2)
                    .filter(|w| w[0] == "flags" && w[1] == "slave")
                    .count();
                field(&master, "num-slaves") == Some(&replicas.to_string())
                    && up == replicas as usize
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

/// The value after `name` in a `SENTINEL master` reply (names and values alternate, one per
/// line).
fn field<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let lines: Vec<&str> = reply.lines().collect();
    lines.windows(2).find(|w| w[0] == name).map(|w| w[1])
}

/// Wait until `cond` holds; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(tally_testkit::wait::wait_until(timeout, cond), "{what}");
}
