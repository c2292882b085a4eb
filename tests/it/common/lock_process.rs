//! `tally lock` as a child process, for the lock tests: its JSON lines arrive on a channel.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tally_counters::config::RedisConfig;
use tally_counters::lock::Locks;
use tally_counters::request::Client;
use tally_testkit::local_redis::LocalRedis;

/// A `tally lock` process; its JSON lines arrive on a channel.
pub struct LockProcess {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl LockProcess {
    pub fn start(redis: &LocalRedis, args: &[&str]) -> LockProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .arg("lock")
            .args(args)
            .args(["--redis-url", &redis.url()])
            .env("TALLY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tally lock");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        LockProcess { child, lines }
    }

    pub fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line from tally lock")
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGKILL it and reap it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status, once it exits within `timeout` (panics otherwise).
    pub fn exit_within(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tally lock still runs after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for LockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A lock client on `redis`.
pub fn locks(redis: &LocalRedis) -> Locks {
    let config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    Locks::new(Client::new(&config).unwrap())
}
