//! A `redis-server` child process on a free loopback port, for the demo, tests and benchmarks.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped, restartable) local Redis. Killed on drop.
pub struct LocalRedis {
    /// Loopback port it listens on (kept across restarts).
    pub port: u16,
    /// Working directory (AOF/RDB files live here).
    pub dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalRedis {
    /// Start `redis-server` with no persistence plus `extra` arguments, and wait until it answers.
    pub fn start(extra: &[&str]) -> std::io::Result<LocalRedis> {
        Self::start_on(free_port()?, extra)
    }

    /// Like `start`, on a given port.
    pub fn start_on(port: u16, extra: &[&str]) -> std::io::Result<LocalRedis> {
        // One directory per instance: a server started on the port of a stopped one (a failover
        // test) must not lose its directory when the old instance is dropped.
        static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tally-redis-{}-{port}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut args: Vec<String> = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut redis = LocalRedis {
            port,
            dir,
            args,
            child: None,
        };
        redis.restart()?;
        Ok(redis)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Start the server again (after `stop`) on the same port and directory.
    pub fn restart(&mut self) -> std::io::Result<()> {
        let child = Command::new("redis-server")
            .args(&self.args)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            // The server's log stays in its directory (kept with TALLY_TEST_KEEP_LOGS).
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot start redis-server (is it installed? scripts/setup.sh installs it): {e}"))
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // It exited (it refuses a truncated AOF with `aof-load-truncated no`, its port is
            // taken): whatever answers on the port is not this server.
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(std::io::Error::other(format!(
                    "redis-server on port {} exited at start ({status}); its log: {}",
                    self.port,
                    self.dir.join("redis.log").display()
                )));
            }
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200))
                {
                    match redis::cmd("PING").query::<String>(&mut conn) {
                        Ok(_) => return Ok(()),
                        // Still loading its AOF/RDB: it answers, but not to commands yet.
                        Err(e) if e.code() == Some("LOADING") => {}
                        // NOAUTH and the like: the server is up, it just wants credentials.
                        Err(e) if !e.is_io_error() && !e.is_connection_dropped() => return Ok(()),
                        Err(_) => {}
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::other(format!(
            "redis-server on port {} did not answer",
            self.port
        )))
    }

    /// Start the server again, repairing its AOF first if it refuses to load it: with
    /// `aof-load-truncated no` a server killed in the middle of writing its AOF does not start
    /// until `redis-check-aof --fix` cuts the file back to its last whole command or
    /// transaction (what an operator does). Returns whether a repair was needed.
    pub fn restart_repairing_aof(&mut self) -> std::io::Result<bool> {
        if self.restart().is_ok() {
            return Ok(false);
        }
        let manifest = self
            .dir
            .join("appendonlydir")
            .join("appendonly.aof.manifest");
        let mut fix = Command::new("redis-check-aof")
            .arg("--fix")
            .arg(&manifest)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        if let Some(mut stdin) = fix.stdin.take() {
            use std::io::Write;
            stdin.write_all(b"y\n")?;
        }
        let status = fix.wait()?;
        if !status.success() {
            return Err(std::io::Error::other(format!(
                "redis-check-aof --fix {} failed: {status}",
                manifest.display()
            )));
        }
        self.restart()?;
        Ok(true)
    }

    /// The server's process id while it runs (to stall it with SIGSTOP in tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kill the server (SIGKILL) and wait for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.stop();
        // TALLY_TEST_KEEP_LOGS keeps the server's directory (its AOF) to read after a failure.
        if std::env::var_os("TALLY_TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A free port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> std::io::Result<u16> {
    for _ in 0..200 {
        let port = 20_000 + (rand::random::<u16>() % 25_000);
        let a = TcpListener::bind(("127.0.0.1", port));
        let b = TcpListener::bind(("127.0.0.1", port + 10_000));
        if a.is_ok() && b.is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "no free port pair for a cluster node",
    ))
}

/// A Redis Cluster of local `redis-server` processes: primaries with replicas, on loopback.
pub struct LocalCluster {
    /// Every node, primaries first as created (roles change after a failover).
    pub nodes: Vec<LocalRedis>,
}

impl LocalCluster {
    /// Start `primaries` primaries with `replicas` replicas each, create the cluster with
    /// `redis-cli --cluster create`, and wait until every node reports `cluster_state:ok`.
    /// Node timeout 1 s.
    pub fn start(primaries: usize, replicas: usize) -> std::io::Result<LocalCluster> {
        Self::start_with_node_timeout(primaries, replicas, 1000)
    }

    /// [`LocalCluster::start`] with `cluster-node-timeout` `node_timeout_ms`.
    pub fn start_with_node_timeout(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u32,
    ) -> std::io::Result<LocalCluster> {
        let timeout = node_timeout_ms.to_string();
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas) {
            let port = free_cluster_port()?;
            let conf = format!("nodes-{port}.conf");
            nodes.push(LocalRedis::start_on(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    &timeout,
                    // Replicas sync at once, so a failover soon after start has a replica to promote.
                    "--repl-diskless-sync-delay",
                    "0",
                ],
            )?);
        }
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = cmd
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let cluster = LocalCluster { nodes };
        cluster.wait_ok(Duration::from_secs(30))?;
        cluster.wait_synced(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Wait until every running replica has completed its sync with its primary.
    pub fn wait_synced(&self, timeout: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
            node_info(n.port, "INFO", "replication")
                .is_some_and(|i| i.contains("role:master") || i.contains("master_link_status:up"))
        }) {
            if Instant::now() > deadline {
                return Err(std::io::Error::other("replicas did not sync"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(LocalRedis::url).collect()
    }

    /// Wait until every running node says the cluster is ok and all slots are served.
    pub fn wait_ok(&self, timeout: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                node_info(n.port, "CLUSTER", "INFO")
                    .map(|i| i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384"))
                    .unwrap_or(false)
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other("cluster did not become ok"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ports of the nodes that are currently primaries (as the first live node sees it).
    pub fn primaries(&self) -> Vec<u16> {
        let Some(text) = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find_map(|n| node_info(n.port, "CLUSTER", "NODES"))
        else {
            return Vec::new();
        };
        let mut ports: Vec<u16> = text
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter_map(|addr| addr.split('@').next()?.rsplit(':').next()?.parse().ok())
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The node listening on `port`.
    pub fn node_mut(&mut self, port: u16) -> Option<&mut LocalRedis> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }
}

fn node_info(port: u16, a: &str, b: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    redis::cmd(a).arg(b).query::<String>(&mut conn).ok()
}
