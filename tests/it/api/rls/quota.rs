//! envoyproxy/ratelimit's `quota_mode` and descriptor `metadata`, called directly: its own
//! integration scenarios (`integration-test/scripts/quota.sh`, `token-quota.sh`, with the
//! quotas of `examples/ratelimit/config/example.yaml`: service_1 1, service_2 2) answered as it
//! documents them, minus its over-counting; and, under 64 concurrent calls, counts in Redis
//! equal to what was admitted, never past a quota.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::value::Kind;

use crate::common::rls::{ask, descriptor, fixed_count, unique, Rls, RlsServer};

/// example.yaml's quotas (a day, not a minute, so that no window boundary falls inside a test:
/// the answers do not depend on the window's length), and two quotas and a limit by value.
const LIMITS: &str = "domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: \"service_1\"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
    metadata:
      service_with_quota:
        name: \"service_2\"
  - key: q_small
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: q_large
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 12}
";

/// `metadata.service_with_quota.name` of an answer's dynamic metadata.
fn routed_to(r: &RateLimitResponse) -> Option<String> {
    let mut at = r.dynamic_metadata.as_ref()?;
    for key in ["metadata", "service_with_quota"] {
        match at.fields.get(key)?.kind.as_ref()? {
            Kind::StructValue(s) => at = s,
            _ => return None,
        }
    }
    match at.fields.get("name")?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_scenarios_answer_as_ratelimit_documents_without_over_counting() {
    let server = RlsServer::start("quota", &[("rl.yaml", LIMITS)]);
    let rls = &server.rls;
    let redis = &server.redis;
    let dir = &server.dir;
    let mut c = rls.client().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let both = || {
        vec![
            descriptor(&[("service", "service_1")], None),
            descriptor(&[("service", "service_2")], None),
        ]
    };

    // quota.sh: "Quota is debited from all matching buckets and 3rd request should be rejected".
    let r = ask(&mut c, "rl", both()).await;
    assert_eq!(codes(&r), (ok, vec![ok, ok]));
    assert_eq!(
        routed_to(&r).as_deref(),
        Some("service_1"),
        "first passing wins"
    );
    let r = ask(&mut c, "rl", both()).await;
    assert_eq!(codes(&r), (ok, vec![over, ok]), "service_2 still has room");
    assert_eq!(routed_to(&r).as_deref(), Some("service_2"));
    let r = ask(&mut c, "rl", both()).await;
    assert_eq!(codes(&r), (over, vec![over, over]), "every quota is out");
    assert_eq!(routed_to(&r), None, "nothing passed: no `metadata`");
    // envoyproxy/ratelimit counts 3 and 3 here: every call, denied or not, on every bucket.
    assert_eq!(
        fixed_count(redis, "service_1"),
        1,
        "a quota is never counted past its limit"
    );
    assert_eq!(fixed_count(redis, "service_2"), 2);

    // token-quota.sh on service_2 (a fresh domain file would do; here its own value): checked
    // with addend 0 on the request, charged 1 when the response is done. ratelimit answers OK
    // to a check of a full quota (3 pass, the 4th is denied); tally's check needs a unit left.
    std::fs::write(
        dir.join("tq.yaml"),
        "domain: tq\ndescriptors:\n  - key: service\n    quota_mode: true\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .unwrap();
    let service = unique("svc");
    let check = || vec![descriptor(&[("service", service.as_str())], Some(0))];
    let charge = || vec![descriptor(&[("service", service.as_str())], Some(1))];
    let mut c = wait_for_domain(rls, "tq", &service).await;
    for i in 0..2 {
        assert_eq!(
            ask(&mut c, "tq", check()).await.overall_code,
            ok,
            "request {i}"
        );
        assert_eq!(ask(&mut c, "tq", charge()).await.overall_code, ok);
    }
    assert_eq!(ask(&mut c, "tq", check()).await.overall_code, over);
    assert_eq!(fixed_count(redis, &service), 2);

    // 64 concurrent calls on two quotas (5 and 20): exactly 20 pass (the larger lasts), each
    // quota charged only while it had room; then with a limit of 12 beside fresh quotas, that
    // limit still denies on its own: exactly 12 pass.
    for with_user in [false, true] {
        let (small, large, user) = (unique("small"), unique("large"), unique("user"));
        let mut calls = Vec::new();
        for _ in 0..64 {
            let mut c = c.clone();
            let mut ds = vec![
                descriptor(&[("q_small", small.as_str())], None),
                descriptor(&[("q_large", large.as_str())], None),
            ];
            if with_user {
                ds.push(descriptor(&[("user", user.as_str())], None));
            }
            calls.push(tokio::spawn(async move { ask(&mut c, "rl", ds).await }));
        }
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        let admitted = answers.iter().filter(|r| r.overall_code == ok).count() as u64;
        let passed = |i: usize| {
            answers
                .iter()
                .filter(|r| r.overall_code == ok && r.statuses[i].code == ok)
                .count() as u64
        };
        let want = if with_user { 12 } else { 20 };
        assert_eq!(admitted, want, "with a limit beside: {with_user}");
        assert_eq!(fixed_count(redis, &small), 5);
        assert_eq!(
            passed(0),
            5,
            "the admitted calls that small's status shows charged"
        );
        assert_eq!(fixed_count(redis, &large), want);
        assert_eq!(passed(1), want);
        if with_user {
            assert_eq!(fixed_count(redis, &user), 12);
        }
    }
}

/// A client once `domain` is loaded (the reloader picks new files up within 100 ms).
async fn wait_for_domain(rls: &Rls, domain: &str, value: &str) -> crate::common::rls::Client {
    let mut c = rls.client().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // A peek at a value no one charges: an unknown domain answers without `current_limit`.
    let probe = format!("{value}-probe");
    loop {
        let r = ask(
            &mut c,
            domain,
            vec![descriptor(&[("service", probe.as_str())], Some(0))],
        )
        .await;
        if r.statuses[0].current_limit.is_some() {
            return c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{domain} never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
