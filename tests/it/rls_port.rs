//! The RLS port itself: the bearer token on `ShouldRateLimit` (the health service stays open),
//! and routing by service (an unknown one is `UNIMPLEMENTED`, the others keep answering).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tally_testkit::local_redis::LocalRedis;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus::Serving;

use super::rls::{descriptor, health_watch, limits_dir, unique, Rls, API};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_http_token_set_should_rate_limit_needs_it() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("token");
    std::fs::write(dir.join("api.yaml"), API).unwrap();
    let rls = Rls::start_with_token(&redis, &dir, "rls-token", Some("s3cret-rls"));
    let mut c = rls.client().await;
    let user = unique("tok");
    let call = |auth: Option<&str>| {
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &user)], None)],
            hits_addend: 0,
        });
        if let Some(a) = auth {
            req.metadata_mut()
                .insert("authorization", a.parse().unwrap());
        }
        req
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret-rls"),
        Some("Basic s3cret-rls"),
    ] {
        let e = c.should_rate_limit(call(auth)).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{auth:?}: {e:?}");
    }
    let r = c
        .should_rate_limit(call(Some("Bearer s3cret-rls")))
        .await
        .expect("the token passes")
        .into_inner();
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "refused calls charged nothing"
    );
    // The health service stays open, as /health/* does.
    health_watch(rls.port).await.wait_for(Serving).await;
}

/// The port routes by service: a call to a service it does not serve is answered
/// `UNIMPLEMENTED` (as gRPC says), and the connection keeps serving the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_grpc_service_is_unimplemented() {
    let redis = LocalRedis::start(&[]).unwrap();
    let dir = limits_dir("unknown-service");
    std::fs::write(dir.join("api.yaml"), API).unwrap();
    let rls = Rls::start(&redis, &dir, "rls-unknown-service");
    let mut c = rls.client().await;
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", rls.port))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = "/no.such.Service/Call".parse().unwrap();
    let e = grpc
        .unary(tonic::Request::new(()), path, Empty)
        .await
        .expect_err("no such service");
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    let user = unique("unknown-service");
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor(&[("user", &user)], None)],
            hits_addend: 0,
        })
        .await
        .expect("the rate limit service still answers")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
}

/// A codec of empty messages (an unknown service has no generated stubs).
#[derive(Clone, Copy)]
struct Empty;

impl tonic::codec::Codec for Empty {
    type Encode = ();
    type Decode = ();
    type Encoder = Empty;
    type Decoder = Empty;

    fn encoder(&mut self) -> Empty {
        Empty
    }

    fn decoder(&mut self) -> Empty {
        Empty
    }
}

impl tonic::codec::Encoder for Empty {
    type Item = ();
    type Error = tonic::Status;

    fn encode(&mut self, _: (), _: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        Ok(())
    }
}

impl tonic::codec::Decoder for Empty {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, _: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        Ok(Some(()))
    }
}
