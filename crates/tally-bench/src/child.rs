//! Child processes: this binary re-executed in a role, and `perf record` attached to one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Deserialize;

/// This binary running one role in a child process. Killed on drop if still running.
pub struct ChildRole {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub log: PathBuf,
}

impl ChildRole {
    pub fn spawn(args: &[String], name: &str) -> anyhow::Result<ChildRole> {
        let log =
            std::env::temp_dir().join(format!("tally-bench-{}-{name}.log", std::process::id()));
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .env("TALLY_LOG", "warn,librdkafka=error,rdkafka=error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawning a benchmark role")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ChildRole { child, lines, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, or an error carrying the end of the child's log.
    pub fn line(&self, timeout: Duration) -> anyhow::Result<String> {
        self.lines.recv_timeout(timeout).map_err(|_| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            anyhow::anyhow!("benchmark child gave no answer within {timeout:?}; log:\n{tail}")
        })
    }

    pub fn result<T: for<'de> Deserialize<'de>>(&self, timeout: Duration) -> anyhow::Result<T> {
        let line = self.line(timeout)?;
        serde_json::from_str(&line).with_context(|| format!("child output `{line}`"))
    }

    /// Close stdin (the child's signal to stop) and wait for it to exit.
    pub fn finish(mut self, timeout: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("  child {} did not stop in time; killing it", self.pid());
    }
}

impl Drop for ChildRole {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Block until stdin is closed (the parent's signal to stop).
pub fn wait_for_stdin_eof() {
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
}

/// `perf record` attached to a process, stopped with SIGINT.
pub struct Perf(Option<Child>);

impl Perf {
    pub fn attach(dir: Option<&Path>, pid: u32, name: &str) -> Perf {
        let Some(dir) = dir else { return Perf(None) };
        let _ = std::fs::create_dir_all(dir);
        let out = dir.join(format!("{name}.perf.data"));
        let child = Command::new("perf")
            .args(["record", "-F", "1999", "--call-graph", "dwarf,16384", "-o"])
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| eprintln!("  perf unavailable: {e}"))
            .ok();
        Perf(child)
    }

    pub fn stop(mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
    }
}
