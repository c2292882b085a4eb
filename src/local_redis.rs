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
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("tally-redis-{}-{port}", std::process::id()));
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot start redis-server (is it installed? scripts/setup.sh installs it): {e}"))
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200))
                {
                    if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                        return Ok(());
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
