//! Deployments under test and direct access to their nodes.

use std::time::Duration;

use tally_counters::config::{CounterConfig, RedisConfig, RedisMode};
use tally_counters::model::layout::Layout;
use tally_counters::model::CounterSpec;
use tally_counters::request::Client;
use tally_testkit::local_redis::{LocalCluster, LocalRedis};

/// A standalone server or a 3-primary cluster, stopped on drop.
pub enum Deployment {
    Standalone(LocalRedis),
    Cluster(LocalCluster),
}

impl Deployment {
    pub fn standalone() -> Deployment {
        Deployment::Standalone(LocalRedis::start(&[]).expect("redis-server"))
    }

    pub fn cluster() -> Deployment {
        Deployment::Cluster(LocalCluster::start(3, 0).expect("redis cluster"))
    }

    pub fn config(&self) -> RedisConfig {
        let mut c = RedisConfig::default();
        match self {
            Deployment::Standalone(r) => c.url = r.url(),
            Deployment::Cluster(cl) => {
                c.mode = RedisMode::Cluster;
                c.nodes = cl.urls();
            }
        }
        c
    }

    pub fn layout(&self) -> Layout {
        Layout::for_config(&self.config())
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Deployment::Standalone(r) => vec![r.url()],
            Deployment::Cluster(cl) => cl.urls(),
        }
    }
}

/// `n` independent clients (separate connections, as separate processes would have).
pub fn clients(dep: &Deployment, n: usize) -> Vec<Client> {
    (0..n)
        .map(|_| Client::new(&dep.config()).unwrap())
        .collect()
}

/// A client whose requests time out after `timeout`.
pub fn client_with_timeout(dep: &Deployment, timeout: Duration) -> Client {
    let mut c = dep.config();
    c.response_timeout = timeout;
    Client::new(&c).unwrap()
}

pub fn counter(name: &str, dims: &[&str], window: Duration) -> CounterSpec {
    let mut c = CounterConfig::reference();
    c.name = name.into();
    c.dimensions = dims.iter().map(|d| d.to_string()).collect();
    c.key = format!(
        "{name}:{}:{{yyyyMMddHH}}",
        dims.iter()
            .map(|d| format!("{{{d}}}"))
            .collect::<Vec<_>>()
            .join(":")
    );
    c.window = window;
    CounterSpec::compile(&c).unwrap()
}

async fn node_with_timeout(
    url: &str,
    timeout: Option<Duration>,
) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(timeout);
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

pub async fn node(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Keep every node busy for `busy` with a script that spins: requests sent meanwhile wait in the
/// socket and run when it ends. Returns when every node is busy; the handle ends with the spin.
pub async fn stall_all(dep: &Deployment, busy: Duration) -> tokio::task::JoinHandle<()> {
    const SPIN: &str = "local s = redis.call('TIME') local t0 = s[1] * 1000000 + s[2] \
        while true do local t = redis.call('TIME') \
        if t[1] * 1000000 + t[2] - t0 > tonumber(ARGV[1]) * 1000 then return 1 end end";
    let mut probes = Vec::new();
    for url in dep.urls() {
        probes.push(node_with_timeout(&url, Some(Duration::from_millis(150))).await);
    }
    let mut spins = Vec::new();
    for url in dep.urls() {
        let mut c = node_with_timeout(&url, None).await;
        let ms = busy.as_millis() as u64;
        spins.push(tokio::spawn(async move {
            let _: i64 = redis::cmd("EVAL")
                .arg(SPIN)
                .arg(0)
                .arg(ms)
                .query_async(&mut c)
                .await
                .unwrap();
        }));
    }
    // Wait until every node is inside its spin: a PING no longer answers.
    for mut probe in probes {
        while redis::cmd("PING")
            .query_async::<String>(&mut probe)
            .await
            .is_ok()
        {}
    }
    tokio::spawn(async move {
        for s in spins {
            s.await.unwrap();
        }
    })
}

/// SCRIPT FLUSH on every node.
pub async fn flush_scripts(dep: &Deployment) {
    for url in dep.urls() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node(&url).await)
            .await
            .unwrap();
    }
}

/// Every key on every node has an expiry (PTTL ≠ -1), and there is at least one key.
pub async fn assert_every_key_expires(dep: &Deployment) {
    let mut seen = 0;
    for url in dep.urls() {
        let mut c = node(&url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut c)
            .await
            .unwrap();
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(ttl != -1, "{key} has no expiry");
            seen += 1;
        }
    }
    assert!(seen > 0);
}

/// The one key on any node that matches `pattern` (a KEYS glob).
pub async fn keys_matching(dep: &Deployment, pattern: &str) -> String {
    let mut found = Vec::new();
    for url in dep.urls() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut node(&url).await)
            .await
            .unwrap();
        found.extend(keys);
    }
    assert_eq!(found.len(), 1, "{pattern}: {found:?}");
    found.remove(0)
}
