//! Processes, temporary directories, HTTP and a Prometheus client for the observability tests.
#![allow(unused_imports)]

use super::*;
use tally_testkit::http::{self, Answer, Client};

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A child process in its own process group, stopped on drop: SIGTERM first when `graceful` (so
/// the demo stops its own redis-server), then SIGKILL to the whole group (grandchildren included).
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) graceful: bool,
    pub(crate) log: PathBuf,
}

impl Proc {
    /// Spawn `cmd` with stdout and stderr to `log`. If the spawning thread ends without dropping
    /// this (the test process is killed), the kernel sends `death_signal` to the child
    /// (PR_SET_PDEATHSIG).
    pub(crate) fn spawn(
        name: &'static str,
        mut cmd: Command,
        log: PathBuf,
        graceful: bool,
        death_signal: i32,
    ) -> Proc {
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
                Ok(())
            });
        }
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e} (scripts/setup.sh installs it)"));
        Proc {
            name,
            child,
            graceful,
            log,
        }
    }

    /// Panic with the log if the process has exited.
    pub(crate) fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited early ({status}); log:\n{}",
                self.name,
                tail(&self.log)
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.graceful {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Whatever is left of the group. The group id stays reserved while members exist.
        // SAFETY: kill(2) on the process group this child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last 40 lines of a log file.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let port = tally_testkit::local_redis::free_port().expect("free port");
        let dir =
            std::env::temp_dir().join(format!("tally-obs-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Poll `cond` until it holds; panic with `what` after `timeout`.
pub(crate) fn wait_until(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        tally_testkit::wait::wait_until(timeout, cond),
        "timed out waiting for {what}"
    );
}

/// A Prometheus HTTP API client on a loopback port.
pub(crate) struct Prom {
    pub(crate) port: u16,
}

/// Why a query did not pass.
pub(crate) enum QueryError {
    /// Prometheus refused the query: it is invalid (never fixed by waiting).
    Invalid(String),
    /// The query is valid but returned no series (yet).
    Empty,
    /// Prometheus could not be reached.
    Unreachable(String),
}

impl QueryError {
    pub(crate) fn describe(&self) -> String {
        match self {
            QueryError::Invalid(e) => format!("invalid: {e}"),
            QueryError::Empty => "no series".to_string(),
            QueryError::Unreachable(e) => format!("prometheus unreachable: {e}"),
        }
    }
}

impl Prom {
    /// Prometheus answers a query within seconds; 15 s is for a loaded machine.
    fn client(&self) -> Client {
        Client::new(Duration::from_secs(15))
    }

    /// Evaluate `expr` now; the number of series (or scalar) it returned.
    pub(crate) fn query(&self, expr: &str) -> Result<usize, QueryError> {
        let target = http::with_query("/api/v1/query", &[("query", expr)]);
        let Answer { status, body, .. } = self
            .client()
            .get(self.port, &target, &[])
            .map_err(|e| QueryError::Unreachable(e.to_string()))?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| QueryError::Unreachable(format!("HTTP {status}: {e}: {body}")))?;
        if v["status"] != "success" {
            return Err(QueryError::Invalid(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or(&body)
            )));
        }
        let n = match v["data"]["resultType"].as_str() {
            Some("vector") | Some("matrix") => {
                v["data"]["result"].as_array().map_or(0, |a| a.len())
            }
            Some("scalar") | Some("string") => 1,
            _ => 0,
        };
        if n == 0 {
            Err(QueryError::Empty)
        } else {
            Ok(n)
        }
    }

    /// GET an API path and return `data`.
    pub(crate) fn api(&self, path: &str) -> Value {
        let Answer { status, body, .. } = self
            .client()
            .get(self.port, path, &[])
            .expect("prometheus answers");
        assert_eq!(status, 200, "GET {path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["data"].clone()
    }
}
