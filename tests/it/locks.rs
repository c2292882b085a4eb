//! Locks held by real `tally lock` processes: one frozen with SIGSTOP past its ttl loses the
//! lock, is told so when it resumes, and its release deletes nothing; one killed with SIGKILL
//! leaves a lock that expires.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use tally_counters::config::RedisConfig;
use tally_counters::lock::Locks;
use tally_counters::request::Client;
use tally_testkit::local_redis::LocalRedis;

/// `tally lock` as a child process; its JSON lines arrive on a channel.
struct Holder {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Holder {
    fn start(redis: &LocalRedis, name: &str, ttl: &str, hold: &str) -> Holder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["lock", "--name", name, "--ttl", ttl, "--hold", hold])
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
        Holder { child, lines }
    }

    fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line from tally lock")
    }

    fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn locks(redis: &LocalRedis) -> Locks {
    let config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    Locks::new(Client::new(&config).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_the_lock_and_its_release_deletes_nothing() {
    let redis = LocalRedis::start(&[]).unwrap();
    let holder = Holder::start(&redis, "batch", "600ms", "30s");
    let first = holder.next();
    assert_eq!(first["acquired"], true, "{first}");
    let locks = locks(&redis);
    let ttl = Duration::from_millis(600);
    assert!(
        locks.try_acquire("batch", ttl).await.unwrap().is_err(),
        "held and renewed"
    );

    holder.signal(libc::SIGSTOP);
    // Frozen, its watchdog cannot renew: the lease runs out and another process takes it.
    let taken = locks
        .acquire("batch", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the frozen holder's lease expires");
    assert!(
        taken.fence > first["fence"].as_u64().unwrap(),
        "fencing tokens increase"
    );
    holder.signal(libc::SIGCONT);

    assert_eq!(
        holder.next(),
        serde_json::json!({ "lost": true }),
        "told on resume"
    );
    assert_eq!(holder.next(), serde_json::json!({ "released": false }));
    assert!(
        locks.try_acquire("batch", ttl).await.unwrap().is_err(),
        "the stale release did not delete the new holder's lock"
    );
    assert!(locks.release(&taken).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_lock_expires() {
    let redis = LocalRedis::start(&[]).unwrap();
    let mut holder = Holder::start(&redis, "cron", "800ms", "60s");
    assert_eq!(holder.next()["acquired"], true);
    let _ = holder.child.kill();
    let _ = holder.child.wait();
    let locks = locks(&redis);
    let started = std::time::Instant::now();
    let lease = locks
        .acquire("cron", Duration::from_secs(5), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("acquired once the dead holder's lease ran out");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(lease.fence >= 2);
}
