//! `tansu` (an Apache-Kafka-compatible broker with SQLite storage, crates.io) as a child process:
//! a second Kafka implementation beside librdkafka's mock cluster, one that keeps its data across
//! a kill -9 and speaks SASL/SCRAM.
//!
//! Each [`Tansu`] listens on its own free loopback port, keeps its SQLite file in its own
//! directory, and is killed (and its directory removed) on drop. `scripts/setup.sh` installs the
//! binary (`cargo install tansu --version <pinned> --features libsql`); `TALLY_TANSU` names
//! another one.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::local_redis::free_port;

/// What tansu prints once it accepts connections (`ready in 390ms`).
const READY_LINE: &str = "ready in";

/// A running (or killed, restartable) tansu broker.
pub struct Tansu {
    /// Loopback port it listens on, kept across restarts so clients find it again.
    pub port: u16,
    /// Working directory: the SQLite file (`tansu.db`) and the broker's log live here.
    dir: PathBuf,
    /// Whether clients must authenticate (SASL); users are created while this is off.
    authentication: bool,
    /// The running process; None after [`Tansu::kill9`].
    child: Option<Child>,
    /// How many times it was started: each start must print its own ready line.
    starts: usize,
}

/// The tansu binary: `TALLY_TANSU`, else `tansu` in cargo's bin directory, else on the PATH.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TALLY_TANSU") {
        return PathBuf::from(path);
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    match cargo_home.map(|h| h.join("bin").join("tansu")) {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("tansu"),
    }
}

impl Tansu {
    /// Start tansu without authentication on a free port with an empty SQLite file, and wait
    /// until it accepts connections.
    pub fn start() -> anyhow::Result<Tansu> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("tally-tansu-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut tansu = Tansu {
            port,
            dir,
            authentication: false,
            child: None,
            starts: 0,
        };
        tansu.restart()?;
        Ok(tansu)
    }

    /// `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// Start it again (after [`Tansu::kill9`]) on the same port with the same SQLite file.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("tansu is running; kill9 it first");
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(binary());
        cmd.arg("broker")
            .arg("--listener-url")
            .arg(self.url())
            .arg("--advertised-listener-url")
            .arg(self.url())
            .arg("--storage-engine")
            // Relative to the working directory: `<dir>/tansu.db`.
            .arg("sqlite://tansu.db")
            .current_dir(&self.dir)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone()?)
            .stderr(log);
        if self.authentication {
            cmd.arg("--authentication");
        }
        let child = cmd.spawn().with_context(|| {
            format!(
                "cannot start {} (scripts/setup.sh installs it)",
                binary().display()
            )
        })?;
        self.child = Some(child);
        self.starts += 1;
        self.wait_ready(Duration::from_secs(30))
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().matches(READY_LINE).count() >= self.starts {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!("tansu exited with {status}:\n{}", self.log());
            }
            if Instant::now() >= deadline {
                bail!("tansu not ready within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Kill it with SIGKILL (no chance to flush anything), keeping its data.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restart it so that clients must authenticate with SASL (SCRAM users created before).
    pub fn require_authentication(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.authentication = true;
        self.restart()
    }

    /// Create `name` with `partitions` partitions (with authentication off).
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        self.cli(&[
            "topic",
            "create",
            name,
            "--partitions",
            &partitions.to_string(),
        ])
    }

    /// Create a SCRAM-SHA-512 user (with authentication off).
    pub fn create_user(&self, name: &str, password: &str) -> anyhow::Result<()> {
        self.cli(&["user", "create", name, password, "--mechanism", "scram512"])
    }

    fn cli(&self, args: &[&str]) -> anyhow::Result<()> {
        if self.authentication {
            bail!(
                "tansu's command line does not authenticate: run it before require_authentication"
            );
        }
        let out = Command::new(binary())
            .args(args)
            .arg("--broker")
            .arg(self.url())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "tansu {} failed ({}): {}",
                args[..2].join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("tansu.log")
    }

    /// Everything the broker printed, over every start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
