//! Separate processes for crash tests: a stand-alone mock Kafka broker and `tally run`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tally_testkit::scrape::Scrape;
use tally_testkit::wait::{wait_for_value, wait_until};

/// The `[kafka]` section of a crash test's configuration: a short session, so that a replica
/// killed with SIGKILL leaves the group within seconds.
pub fn kafka_toml(bootstrap: &str, topic: &str, group: &str) -> String {
    format!(
        r#"
[kafka]
brokers = "{bootstrap}"
topic = "{topic}"
group_id = "{group}"
[kafka.properties]
"session.timeout.ms" = "3000"
"heartbeat.interval.ms" = "300"
"#
    )
}

/// The `[redis]` and `[flush]` sections of a crash test's configuration: short Redis timeouts and
/// small, quickly retried flushes, so that a crash or an outage lands mid-flush often.
pub fn redis_flush_toml(redis: &str) -> String {
    format!(
        r#"[redis]
url = "{redis}"
connect_timeout = "500ms"
response_timeout = "2s"
[flush]
interval = "50ms"
max_keys_per_call = 25
retry_initial = "20ms"
retry_max = "300ms"
shutdown_grace = "20s"
"#
    )
}

/// `tally mock-broker` in its own process, so tally can be SIGKILLed without killing Kafka.
pub struct BrokerProcess {
    child: Child,
    pub bootstrap: String,
}

impl BrokerProcess {
    pub fn start(topics: &[(&str, i32)]) -> BrokerProcess {
        Self::start_with(topics, &[])
    }

    /// As [`BrokerProcess::start`], with more `tally mock-broker` arguments.
    pub fn start_with(topics: &[(&str, i32)], args: &[&str]) -> BrokerProcess {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tally"));
        cmd.arg("mock-broker").args(args);
        for (t, n) in topics {
            cmd.arg("--topic").arg(format!("{t}:{n}"));
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn broker");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("broker prints its address");
        let bootstrap = line
            .trim()
            .strip_prefix("bootstrap=")
            .expect("bootstrap= line")
            .to_string();
        BrokerProcess { child, bootstrap }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tally run --config <file>` in its own process.
pub struct TallyProcess {
    child: Option<Child>,
    pub port: u16,
    config_path: std::path::PathBuf,
}

impl TallyProcess {
    /// Start `tally run` with `config` (TOML text without the [http] section; one is added).
    pub fn start(config: &str, name: &str) -> TallyProcess {
        TallyProcess::start_command("run", config, name)
    }

    /// Start `tally <command>` with `config`, as [`TallyProcess::start`].
    pub fn start_command(command: &str, config: &str, name: &str) -> TallyProcess {
        Self::start_command_with_http(command, config, name, "")
    }

    /// As [`Self::start_command`], with `http` (lines of the `[http]` table, e.g. a token)
    /// beside the listen address this sets.
    pub fn start_command_with_http(
        command: &str,
        config: &str,
        name: &str,
        http: &str,
    ) -> TallyProcess {
        Self::start_command_with_env(command, config, name, http, &[])
    }

    /// As [`Self::start_command_with_http`], with `env` added to the process's environment.
    pub fn start_command_with_env(
        command: &str,
        config: &str,
        name: &str,
        http: &str,
        env: &[(&str, &str)],
    ) -> TallyProcess {
        let port = tally_testkit::local_redis::free_port().unwrap();
        let config_path =
            std::env::temp_dir().join(format!("tally-{name}-{}-{port}.toml", std::process::id()));
        let text = format!("{config}\n[http]\nlisten = \"127.0.0.1:{port}\"\n{http}\n");
        std::fs::write(&config_path, text).unwrap();
        let log = std::fs::File::create(config_path.with_extension("log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .arg(command)
            .arg("--config")
            .arg(&config_path)
            .env("TALLY_LOG", "info,librdkafka=warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn tally");
        TallyProcess {
            child: Some(child),
            port,
            config_path,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let mut c = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!(
                    "tally did not exit within {timeout:?} of SIGTERM; log: {}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The value of sample `name` (`name` or `name{label="value"}`, exactly those labels), if
    /// served within 2 s (a stopped process answers nothing).
    pub fn metric(&self, name: &str) -> Option<f64> {
        Scrape::get(self.port, Duration::from_secs(2))?.value(name)
    }

    /// Wait until metric `name` is at least `min`; false on timeout.
    pub fn wait_metric(&self, name: &str, min: f64, timeout: Duration) -> bool {
        wait_until(timeout, || self.metric(name).is_some_and(|v| v >= min))
    }

    /// The end of a crash test: let this replica run until `applied()` (the applied offsets
    /// Redis holds) equals `produced` (panics with the log after `timeout`), then SIGTERM it
    /// once it owns partitions (so SIGTERM means "drain") and assert that it exits 0.
    pub fn finish(
        &mut self,
        produced: &[i64],
        timeout: Duration,
        applied: impl FnMut() -> Vec<i64>,
    ) {
        self.catch_up(produced, timeout, applied);
        self.drain();
    }

    /// Wait until `applied()` equals `produced`; panics with the log after `timeout`.
    pub fn catch_up(&self, produced: &[i64], timeout: Duration, applied: impl FnMut() -> Vec<i64>) {
        if let Err(applied) = wait_for_value(timeout, Duration::from_millis(100), applied, |a| {
            a == produced
        }) {
            panic!(
                "final run did not catch up: applied {applied:?} produced {produced:?}\n{}",
                self.log()
            );
        }
    }

    /// SIGTERM once it owns partitions (so SIGTERM means "drain"); it must exit 0.
    pub fn drain(&mut self) {
        // It must be up (signal handlers installed, partitions owned) before SIGTERM.
        assert!(self.wait_metric("tally_assigned_partitions", 1.0, Duration::from_secs(60)));
        let status = self.terminate(Duration::from_secs(30));
        assert!(status.success(), "SIGTERM exits 0, got {status:?}");
    }

    /// Wait until it owns partitions (panics after 60 s), then until it has consumed something
    /// (up to 10 s: there may be no backlog left). Returns whether it is consuming.
    pub fn wait_working(&self) -> bool {
        assert!(
            self.wait_metric("tally_assigned_partitions", 1.0, Duration::from_secs(60)),
            "replica never got partitions:\n{}",
            self.log()
        );
        self.wait_metric(
            "tally_messages_consumed_total",
            1.0,
            Duration::from_secs(10),
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.config_path.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for TallyProcess {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_file(&self.config_path);
        // TALLY_TEST_KEEP_LOGS keeps tally's log beside its config (to read after a failure).
        if std::env::var_os("TALLY_TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_file(self.config_path.with_extension("log"));
        }
    }
}

/// Kill `t` with SIGKILL at one of three moments, in turn by `round`: inside a flush (Redis
/// writes held by `CLIENT PAUSE`, so the flush pipeline is sent but unanswered), right after a
/// flush landed (before or around its Kafka commit), or at a random moment. Returns whether
/// keys were pending in a held flush when it died.
pub fn kill_somewhere(
    t: &mut TallyProcess,
    round: usize,
    rng: &mut impl rand::Rng,
    conn: &mut redis::Connection,
) -> bool {
    use rand::RngExt;
    let mut mid_flush = false;
    match round % 3 {
        0 => {
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(400)
                .arg("WRITE")
                .query(conn)
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.random_range(100..300)));
            mid_flush = t.metric("tally_pending_keys").is_some_and(|v| v > 0.0);
        }
        1 => {
            let flushes = t
                .metric("tally_flush_duration_seconds_count")
                .unwrap_or(0.0);
            t.wait_metric(
                "tally_flush_duration_seconds_count",
                flushes + 1.0,
                Duration::from_secs(10),
            );
        }
        _ => std::thread::sleep(Duration::from_millis(rng.random_range(0..1500))),
    }
    t.kill9();
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(conn).unwrap();
    mid_flush
}
