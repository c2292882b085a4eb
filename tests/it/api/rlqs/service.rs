//! Envoy's rate limit quota service called directly with the generated stubs (the protocol
//! Envoy's filter speaks): `tally serve` with `[rlqs]` on the RLS port, on a real redis-server.
//! Two streams (two Envoys) on two tally replicas share one limit through Redis: what they are
//! granted plus what they reported never passes it; a bucket idle for `abandon_after` is abandoned; a stream's buckets, its
//! domain and its token are checked.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tally_testkit::local_redis::LocalRedis;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::common::rls::{limits_dir, Rls};

/// One Envoy's stream: reports in, answers out.
pub(crate) struct Stream {
    pub(crate) tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub(crate) rx: tonic::Streaming<RateLimitQuotaResponse>,
}

pub(crate) fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

pub(crate) fn usage(id: &BucketId, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id.clone()),
        // As Envoy says it (whole seconds): the reports here come faster than a real Envoy's.
        time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

impl Stream {
    pub(crate) async fn open(port: u16, token: Option<&str>) -> Result<Stream, tonic::Status> {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Stream::on(channel, token).await
    }

    /// A stream on `channel` (streams on one channel share its connection).
    pub(crate) async fn on(channel: Channel, token: Option<&str>) -> Result<Stream, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(4);
        let reports =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut request = tonic::Request::new(reports);
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let rx = client.stream_rate_limit_quotas(request).await?.into_inner();
        Ok(Stream { tx, rx })
    }

    /// Send a report and wait for its answer.
    pub(crate) async fn report(
        &mut self,
        domain: &str,
        usages: Vec<BucketQuotaUsage>,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        let reports = RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: usages,
        };
        self.tx.send(reports).await.expect("stream open");
        let answer = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an answer within 10 s")?;
        Ok(answer.expect("an answer, not the end"))
    }
}

/// The grant of the answer's one bucket: what its token bucket admits within the assignment's
/// time to live (2 s: `max_tokens` and its refill), 0 for `DENY_ALL`; `None` for an abandon. A
/// grant comes after a `DENY_ALL` of the same bucket (so that Envoy starts it full).
pub(crate) fn granted(answer: &RateLimitQuotaResponse) -> Option<u64> {
    let actions = &answer.bucket_action;
    assert!(matches!(actions.len(), 1 | 2), "{answer:?}");
    assert!(actions.iter().all(|a| a.bucket_id == actions[0].bucket_id));
    let grants: Vec<Option<u64>> = actions
        .iter()
        .map(|a| match a.bucket_action.as_ref().unwrap() {
            Action::AbandonAction(_) => None,
            Action::QuotaAssignmentAction(a) => {
                assert_eq!(a.assignment_time_to_live.unwrap().seconds, 2);
                match a.rate_limit_strategy.unwrap().strategy.unwrap() {
                    Strategy::TokenBucket(t) => {
                        let every = t.fill_interval.unwrap().seconds as u64;
                        let refill = u64::from(t.tokens_per_fill.unwrap().value) * 2 / every;
                        Some(u64::from(t.max_tokens) + refill)
                    }
                    Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => Some(0),
                    other => panic!("unexpected strategy {other:?}"),
                }
            }
        })
        .collect();
    if grants.len() == 2 {
        assert_eq!(grants[0], Some(0), "a DENY_ALL first: {answer:?}");
        assert!(grants[1].is_some_and(|g| g > 0), "then a grant: {answer:?}");
    }
    grants[grants.len() - 1]
}

fn start(redis: &LocalRedis, name: &str, token: Option<&str>) -> Rls {
    let dir = limits_dir(name);
    std::fs::write(dir.join("edge.yaml"), "domain: other\ndescriptors: []\n").unwrap();
    let rlqs = "\n[rlqs]\nreport_interval = \"1s\"\nassignment_ttl = \"2s\"\nabandon_after = \"2s\"\n\
                max_buckets_per_stream = 2\n\
                [[rlqs.buckets]]\ndomain = \"edge\"\nname = \"per_tenant\"\nlimit = 100\nwindow = \"1h\"\n\
                match = { name = \"per_tenant\" }\n";
    Rls::start_with(redis, &dir, name, token, rlqs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_share_one_limit_and_idle_buckets_are_abandoned() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(&redis, "rlqs-share", None);
    // A second replica on the same Redis: the ledger, not a process, holds the budget.
    let replica = start(&redis, "rlqs-share-replica", None);
    let _ = (rls.client().await, replica.client().await);
    let run = std::process::id().to_string();
    let id = bucket(&[("name", "per_tenant"), ("tenant", &run)]);
    let mut a = Stream::open(rls.port, None).await.unwrap();
    let mut b = Stream::open(replica.port, None).await.unwrap();

    // Each stream subscribes, then reports heavy use: what was reported allowed plus what is
    // granted at any time stays within the limit of 100, whatever the order.
    let mut used = 0;
    let mut held: HashMap<&str, u64> = HashMap::new();
    for round in 0..8 {
        for (name, s) in [("a", &mut a), ("b", &mut b)] {
            // Each spends its whole grant (the first report: one request).
            let spent = held.get(name).copied().unwrap_or(1);
            used += spent;
            let g = granted(&s.report("edge", vec![usage(&id, spent, 40)]).await.unwrap())
                .expect("a grant");
            held.insert(name, g);
            let outstanding: u64 = held.values().sum();
            assert!(
                used + outstanding <= 100,
                "round {round}: used {used} + granted {outstanding} > 100"
            );
        }
    }
    assert!(used >= 85, "the budget was handed out: {used}");
    // Spent: both are denied.
    assert_eq!(
        granted(
            &a.report("edge", vec![usage(&id, held["a"], 40)])
                .await
                .unwrap()
        ),
        Some(0)
    );

    // A bucket idle for abandon_after (2 s) is abandoned at its next report.
    let idle = bucket(&[("name", "per_tenant"), ("tenant", &format!("{run}-idle"))]);
    assert!(granted(&a.report("edge", vec![usage(&idle, 1, 0)]).await.unwrap()).is_some());
    // Meanwhile the stream reports, as Envoy does every interval (a silent one is closed).
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1050)).await;
        a.report("edge", vec![usage(&id, 0, 1)]).await.unwrap();
    }
    assert_eq!(
        granted(&a.report("edge", vec![usage(&idle, 0, 0)]).await.unwrap()),
        None
    );

    // The per-limit series (CONFIGURED_ONLY in the observability test: the demo has no [rlqs]).
    let metrics = tally_testkit::http::request(rls.tally.port, "/metrics", &[])
        .unwrap()
        .body;
    let labels = "domain=\"edge\",limit=\"per_tenant\"";
    for series in [
        format!("tally_rlqs_actions_total{{action=\"grant\",{labels}}}"),
        format!("tally_rlqs_actions_total{{action=\"deny_all\",{labels}}}"),
        format!("tally_rlqs_actions_total{{action=\"abandon\",{labels}}} 1"),
        format!("tally_rlqs_granted_requests_total{{{labels}}}"),
        format!("tally_rlqs_reported_requests_total{{{labels},outcome=\"denied\"}}"),
        format!("tally_rlqs_window_used{{{labels}}}"),
        "tally_rlqs_streams 1".to_string(),
    ] {
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
}

/// A new Envoy (a scale-up, a rolling deploy) reports a bucket first with the one request it
/// denied: it is granted what its peers need, not one request per report interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_envoys_first_grant_is_its_peers_need() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(&redis, "rlqs-first", None);
    let _ = rls.client().await;
    let id = bucket(&[("name", "per_tenant"), ("tenant", "new-envoy")]);
    let mut a = Stream::open(rls.port, None).await.unwrap();
    // 5 requests/s over 1 s reports: a need of 5 × 1 s × headroom 2 + floor 1 = 11.
    for _ in 0..2 {
        let g = granted(&a.report("edge", vec![usage(&id, 5, 0)]).await.unwrap());
        assert_eq!(g, Some(11));
    }
    let mut b = Stream::open(rls.port, None).await.unwrap();
    let first = granted(&b.report("edge", vec![usage(&id, 0, 1)]).await.unwrap());
    // Measured alone, 1 request in 1 s would be a need of 3.
    assert_eq!(first, Some(11), "the new Envoy's first grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_bounded_and_checked() {
    let redis = LocalRedis::start(&[]).unwrap();
    let rls = start(&redis, "rlqs-bounds", Some("sesame"));
    let _ = rls.client().await;

    // Without the token: refused.
    let refused = Stream::open(rls.port, None).await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );

    let mut s = Stream::open(rls.port, Some("sesame")).await.unwrap();
    // Two buckets per stream: a third is skipped; one without a limit is skipped; both counted.
    let ids: Vec<BucketId> = (0..3)
        .map(|i| bucket(&[("name", "per_tenant"), ("tenant", &i.to_string())]))
        .collect();
    let unknown = bucket(&[("name", "elsewhere")]);
    let reports: Vec<_> = [&unknown]
        .into_iter()
        .chain(&ids)
        .map(|id| usage(id, 1, 0))
        .collect();
    let answer = s.report("edge", reports).await.unwrap();
    let answered: std::collections::BTreeSet<_> = answer
        .bucket_action
        .iter()
        .map(|a| {
            let id = &a.bucket_id.as_ref().unwrap().bucket;
            id.iter().collect::<std::collections::BTreeMap<_, _>>()
        })
        .collect();
    assert_eq!(answered.len(), 2, "{answer:?}");
    let metrics = tally_testkit::http::request(
        rls.tally.port,
        "/metrics",
        &[("Authorization", "Bearer sesame")],
    )
    .unwrap()
    .body;
    for reason in ["too_many_buckets", "no_limit"] {
        let line = format!("tally_rlqs_skipped_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }

    // A first report without a domain ends the stream.
    let mut s = Stream::open(rls.port, Some("sesame")).await.unwrap();
    let err = s.report("", vec![usage(&ids[0], 1, 0)]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}
