//! The rate limit service's harness: `tally serve` with `[rls]` on a real redis-server, the
//! generated client, descriptors and limits directories. `RlsServer` is the bootstrap most RLS
//! tests start from (a redis-server, a limits directory holding the test's files, tally).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tally_testkit::local_redis::{free_port, LocalRedis};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::common::process::TallyProcess;

/// The generated client.
pub type Client = RateLimitServiceClient<Channel>;

/// `tally serve` with the RLS on its own port, answering from `limits` (a file or directory).
pub struct Rls {
    pub tally: TallyProcess,
    pub port: u16,
}

impl Rls {
    pub fn start(redis: &LocalRedis, limits: &Path, name: &str) -> Rls {
        Rls::start_with_token(redis, limits, name, None)
    }

    /// With `http.token` set to `token`: `ShouldRateLimit` then needs it.
    pub fn start_with_token(
        redis: &LocalRedis,
        limits: &Path,
        name: &str,
        token: Option<&str>,
    ) -> Rls {
        Rls::start_with(redis, limits, name, token, "")
    }

    /// With more `[rls]` settings (`rls` is appended to the table).
    pub fn start_with(
        redis: &LocalRedis,
        limits: &Path,
        name: &str,
        token: Option<&str>,
        rls: &str,
    ) -> Rls {
        let port = free_port().unwrap();
        let config = format!(
            "[redis]\nurl = \"{}\"\n\n[rls]\nlisten = \"127.0.0.1:{port}\"\nlimits_file = \"{}\"\nreload_interval = \"100ms\"\n{rls}\n",
            redis.url(),
            limits.display()
        );
        let http = token.map_or(String::new(), |t| format!("token = \"{t}\""));
        Rls {
            tally: TallyProcess::start_command_with_http("serve", &config, name, &http),
            port,
        }
    }

    /// A client, once the server accepts connections.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let url = format!("http://127.0.0.1:{}", self.port);
            match RateLimitServiceClient::connect(url).await {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => {
                    panic!("rls never answered: {e}; log: {}", self.tally.log())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// The count (`n`) of the one fixed-window key whose name holds `value`; 0 when there is none.
pub(crate) fn fixed_count(redis: &LocalRedis, value: &str) -> u64 {
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{value}*"))
        .query(&mut con)
        .unwrap();
    match keys.as_slice() {
        [] => 0,
        [key] => redis::cmd("HGET")
            .arg(key)
            .arg("n")
            .query(&mut con)
            .unwrap(),
        more => panic!("{more:?}"),
    }
}

/// A fresh directory for limits files.
pub fn limits_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-rls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A descriptor of `(key, value)` entries, with its own addend when `addend` is set.
pub fn descriptor(entries: &[(&str, &str)], addend: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        hits_addend: addend.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

pub async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    })
    .await
    .expect("answered")
    .into_inner()
}

/// A redis-server of its own and `tally serve` answering the RLS from a fresh limits directory
/// that holds the test's files: the bootstrap most RLS tests start from. Fields drop in order:
/// tally stops before its Redis.
pub struct RlsServer {
    pub rls: Rls,
    pub dir: PathBuf,
    pub redis: LocalRedis,
}

impl RlsServer {
    /// `files` (name, text) in the directory `limits_dir(name)`; the process is `rls-{name}`.
    pub fn start(name: &str, files: &[(&str, &str)]) -> RlsServer {
        RlsServer::start_with(name, files, None, "")
    }

    /// With `http.token` set to `token` and `rls` appended to the `[rls]` table.
    pub fn start_with(
        name: &str,
        files: &[(&str, &str)],
        token: Option<&str>,
        rls: &str,
    ) -> RlsServer {
        let redis = LocalRedis::start(&[]).unwrap();
        let dir = limits_dir(name);
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        let rls = Rls::start_with(&redis, &dir, &format!("rls-{name}"), token, rls);
        RlsServer { rls, dir, redis }
    }
}

/// A unique value per run, so counts start at zero.
pub(crate) fn unique(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

pub(crate) const API: &str = "domain: api
descriptors:
  - key: user
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: 3
  - key: route
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: internal
    rate_limit:
      unlimited: true
  - key: tokens
    rate_limit:
      unit: day
      requests_per_unit: 100
      usage: true
";

/// `grpc.health.v1.Health/Watch` streams of the server (`""`) and of the rate limit service.
pub(crate) struct HealthWatch(Vec<tonic::Streaming<HealthCheckResponse>>);

pub(crate) async fn health_watch(port: u16) -> HealthWatch {
    let channel = tonic::transport::Endpoint::new(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut streams = Vec::new();
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let req = HealthCheckRequest {
            service: service.into(),
        };
        streams.push(client.watch(req).await.unwrap().into_inner());
    }
    HealthWatch(streams)
}

impl HealthWatch {
    /// Until both names report `want` (the probe runs every second: 10 s at most).
    pub(crate) async fn wait_for(&mut self, want: ServingStatus) {
        for stream in &mut self.0 {
            let seen = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let status = stream.message().await.unwrap().unwrap().status;
                    if status == want as i32 {
                        return;
                    }
                }
            })
            .await;
            assert!(seen.is_ok(), "gRPC health never became {want:?}");
        }
    }
}
