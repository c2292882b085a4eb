//! Envoy's rate limit service, called directly with the generated stubs (the client Envoy
//! itself uses speaks the same protocol): `tally serve` with `[rls]` on a real redis-server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tally_testkit::local_redis::{free_port, LocalRedis};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus::{self, NotServing, Serving};
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

fn ok(s: &DescriptorStatus) -> bool {
    s.code == Code::Ok as i32
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

/// Envoy's per-descriptor `limit` overrides: each unit (and limit) counts in its own state, so a
/// descriptor limited per second and per minute in one call is held to both (they shared one
/// policy name, and the per-second window index reset the per-minute count). Oversized
/// descriptors are refused as INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_of_different_units_count_apart() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("overrides");
    std::fs::write(dir.join("api.yaml"), API).unwrap();
    let rls = Rls::start(&redis, &dir, "rls-overrides");
    let mut c = rls.client().await;
    let user = unique("o");
    let with_limit = |requests_per_unit: u32, unit: i32| {
        let mut d = descriptor(&[("user", &user)], None);
        d.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        d
    };
    // Unit codes of Envoy's enum: 1 second, 3 hour.
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = ask(&mut c, "api", vec![with_limit(1000, 1), with_limit(2, 3)]).await;
        codes.push((r.overall_code, r.statuses[1].limit_remaining));
    }
    let (ok_code, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        codes,
        vec![(ok_code, 1), (ok_code, 0), (over, 0), (over, 0)],
        "2 an hour holds while 1000 a second counts beside it"
    );

    let long = "v".repeat(513);
    let refused = c
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &long)], None)],
            hits_addend: 0,
        })
        .await
        .expect_err("a 513-byte value is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addends_statuses_and_a_denial_that_charges_nothing() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("fields");
    std::fs::write(dir.join("api.yaml"), API).unwrap();
    let rls = Rls::start(&redis, &dir, "rls-fields");
    let mut c = rls.client().await;
    let user = unique("u");
    let route = unique("r");

    // hits_addend 0: checked, nothing charged; every field filled.
    let r = ask(&mut c, "api", vec![descriptor(&[("user", &user)], Some(0))]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let s = &r.statuses[0];
    assert!(ok(s));
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("per_user", 3, 4)
    );
    assert_eq!(s.limit_remaining, 3, "a check charges nothing");
    let reset = s
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset")
        .seconds;
    assert!((1..=86_400).contains(&reset), "{reset}");
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(
        headers.contains(&("RateLimit-Policy", "\"per_user\";q=3;w=86400")),
        "{headers:?}"
    );
    assert!(
        headers
            .iter()
            .any(|(k, v)| *k == "RateLimit" && v.starts_with("\"per_user\";r=3;t=")),
        "{headers:?}"
    );

    // hits_addend N on the descriptor; the route's count rises with the request's addend.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("user", &user)], Some(2)),
            descriptor(&[("route", &route)], None),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 99);
    assert_eq!(
        r.statuses[1].current_limit.as_ref().unwrap().name,
        "",
        "no name configured"
    );

    // 2 more for the user do not fit: the request is denied, and the route is not charged.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("user", &user)], Some(2)),
            descriptor(&[("route", &route)], Some(5)),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert!(!ok(&r.statuses[0]));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert!(ok(&r.statuses[1]), "the route alone admits it");
    let r = ask(
        &mut c,
        "api",
        vec![descriptor(&[("route", &route)], Some(0))],
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "the denied request charged nothing"
    );

    // Unlimited, and a descriptor that matches nothing.
    let r = ask(
        &mut c,
        "api",
        vec![
            descriptor(&[("internal", "x")], None),
            descriptor(&[("nothing", "x")], None),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[1].current_limit.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_charge_overshoots_by_one_charge_at_most() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("usage");
    std::fs::write(dir.join("api.yaml"), API).unwrap();
    let rls = Rls::start(&redis, &dir, "rls-usage");
    let mut c = rls.client().await;
    let who = unique("t");
    let d = |n| descriptor(&[("tokens", &who)], Some(n));
    // Checks pass while something is left; each charge is recorded whatever is left.
    let mut charged = 0;
    loop {
        let check = ask(&mut c, "api", vec![d(0)]).await;
        if check.overall_code != Code::Ok as i32 {
            break;
        }
        let charge = ask(&mut c, "api", vec![d(30)]).await;
        assert_eq!(
            charge.overall_code,
            Code::Ok as i32,
            "a charge is never denied"
        );
        charged += 30;
        assert!(charged <= 130, "checks must stop once the limit is used");
    }
    assert_eq!(charged, 120, "100 + less than one charge");
    let r = ask(&mut c, "api", vec![d(0)]).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_unavailable_at_once_unless_the_policy_decides() {
    let mut redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("down");
    std::fs::write(
        dir.join("api.yaml"),
        "domain: api
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: day, requests_per_unit: 5, on_redis_error: closed}
",
    )
    .unwrap();
    let rls = Rls::start(&redis, &dir, "rls-down");
    let mut c = rls.client().await;
    let r = ask(&mut c, "api", vec![descriptor(&[("open", "a")], None)]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let mut health = health_watch(rls.port).await;
    health.wait_for(Serving).await;
    redis.stop();
    // gRPC health follows Redis: a health-checking Envoy stops sending calls that would fail.
    health.wait_for(NotServing).await;
    for _ in 0..3 {
        let started = Instant::now();
        let e = c
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("open", "a")], None)],
                hits_addend: 0,
            })
            .await
            .expect_err("no answer without redis");
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let r = ask(&mut c, "api", vec![descriptor(&[("closed", "a")], None)]).await;
        assert_eq!(
            r.overall_code,
            Code::OverLimit as i32,
            "on_redis_error: closed decides"
        );
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
    redis.restart().unwrap();
    health.wait_for(Serving).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c
            .should_rate_limit(RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![descriptor(&[("open", "b")], None)],
                hits_addend: 0,
            })
            .await;
        if let Ok(r) = r {
            assert_eq!(r.into_inner().statuses[0].limit_remaining, 4);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rls answers again once redis is back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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
