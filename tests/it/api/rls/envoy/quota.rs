//! Quota mode and descriptor metadata through a real Envoy, replaying envoyproxy/ratelimit's
//! `integration-test/scripts/multiservice-tokenquota.sh` with its `examples/envoy/proxy.yaml`
//! filters: the request checks both services' quotas (`hits_addend` 0); the dynamic metadata
//! of the answer names the first service with room; a header mutation copies it into a
//! header, `header_to_metadata` into `envoy.lb`, and the subset load balancer sends the request
//! to that service; when the stream is done the served service is charged 1. Then 64 requests
//! at once through Envoy on two quotas (5 and 20): exactly 20 pass and Redis holds 5 and 20.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use tally_testkit::envoy::Envoy;
use tally_testkit::http::Client;
use tally_testkit::local_redis::LocalRedis;

use crate::common::rls::{fixed_count, RlsServer};

/// example.yaml's two quotas (a day: no window boundary inside the test), for the routing
/// domain `ms` and the burst domain `burst`.
const LIMITS: &str = "domain: ms
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
";
const BURST: &str = "domain: burst
descriptors:
  - key: quota
    value: small
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: quota
    value: large
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 20}
";

/// An upstream that answers every request with `Hello World from Service <n>`.
fn start_service(n: u8) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut lines = BufReader::new(conn).lines();
                loop {
                    loop {
                        match lines.next() {
                            Some(Ok(l)) if l.is_empty() => break,
                            Some(Ok(_)) => {}
                            _ => return,
                        }
                    }
                    let body = format!("Hello World from Service {n}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if out.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// envoyproxy/ratelimit's proxy.yaml, reduced to the two routes, on loopback ports.
fn bootstrap(port: u16, admin: u16, rls: u16, s1: u16, s2: u16) -> String {
    let endpoint = |p: u16, service: &str| {
        format!(
            "{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}, \
             metadata: {{filter_metadata: {{envoy.lb: {{service: {service}}}}}}}}}"
        )
    };
    format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: edge
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: unused
              failure_mode_deny: true
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}
          - name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - append:
                    header:
                      key: x-service-with-quota
                      value: "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%"
                    append_action: OVERWRITE_IF_EXISTS_OR_ADD
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              request_rules:
              - header: x-service-with-quota
                on_header_present: {{metadata_namespace: envoy.lb, key: service, type: STRING}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: /multiservice-tokenquota}}
                route: {{cluster: multiservice}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: ms
                    rate_limits:
                    - actions: [{{generic_key: {{descriptor_key: service, descriptor_value: service_1}}}}]
                      hits_addend: {{number: 0}}
                    - actions: [{{generic_key: {{descriptor_key: service, descriptor_value: service_2}}}}]
                      hits_addend: {{number: 0}}
                    - actions: [{{request_headers: {{header_name: x-service-with-quota, descriptor_key: service}}}}]
                      hits_addend: {{number: 1}}
                      apply_on_stream_done: true
              - match: {{prefix: /quota}}
                route: {{cluster: multiservice}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: burst
                    rate_limits:
                    - actions: [{{generic_key: {{descriptor_key: quota, descriptor_value: small}}}}]
                    - actions: [{{generic_key: {{descriptor_key: quota, descriptor_value: large}}}}]
  clusters:
  - name: multiservice
    type: STATIC
    lb_subset_config:
      fallback_policy: ANY_ENDPOINT
      subset_selectors: [{{keys: [service]}}]
    load_assignment:
      cluster_name: multiservice
      endpoints: [{{lb_endpoints: [{e1}, {e2}]}}]
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: rls
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls}}}}}}}}}]}}]
"#,
        e1 = endpoint(s1, "service_1"),
        e2 = endpoint(s2, "service_2"),
    )
}

/// Until Redis holds `want` for `value` (the charge is sent once the stream is done).
fn wait_count(redis: &LocalRedis, value: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fixed_count(redis, value) != want {
        assert!(
            Instant::now() < deadline,
            "{value}: {} charged, want {want}",
            fixed_count(redis, value)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn metadata_routes_to_the_service_with_quota_and_quotas_never_over_count() {
    let server = RlsServer::start("envoy-quota", &[("ms.yaml", LIMITS), ("burst.yaml", BURST)]);
    let rls = &server.rls;
    let redis = &server.redis;
    let dir = &server.dir;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(rls.client());
    let (s1, s2) = (start_service(1), start_service(2));
    let envoy = Envoy::start(dir, "quota", 1, |port, admin| {
        bootstrap(port, admin, rls.port, s1, s2)
    })
    .unwrap();
    let client = Client::new(Duration::from_secs(30));

    // multiservice-tokenquota.sh: service_1 serves while it has room, then service_2, then
    // every quota is out. ratelimit's checks pass a full quota (2 for service_1, 3 for
    // service_2, the 6th denied); tally's need a unit left: 1, 2, the 4th denied.
    let path = "/multiservice-tokenquota";
    for (i, (service, charged)) in [("service_1", 1), ("service_2", 1), ("service_2", 2)]
        .into_iter()
        .enumerate()
    {
        let a = client.get(envoy.port, path, &[]).unwrap();
        assert_eq!(a.status, 200, "request {}: {}", i + 1, envoy.log());
        let n = &service[service.len() - 1..];
        assert_eq!(
            a.body,
            format!("Hello World from Service {n}"),
            "request {}",
            i + 1
        );
        wait_count(redis, service, charged);
    }
    let a = client.get(envoy.port, path, &[]).unwrap();
    assert_eq!(a.status, 429, "every quota is out");
    assert_eq!(
        (
            fixed_count(redis, "service_1"),
            fixed_count(redis, "service_2")
        ),
        (1, 2)
    );

    // 64 at once on quotas of 5 and 20: the larger lasts, exactly 20 pass, and neither quota
    // is counted past its limit (ratelimit would count 64 on each).
    let port = envoy.port;
    let statuses: Vec<u16> = (0..64)
        .map(|_| {
            std::thread::spawn(move || {
                Client::new(Duration::from_secs(30))
                    .get(port, "/quota", &[])
                    .unwrap()
                    .status
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let passed = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(passed, 20, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 44);
    assert_eq!(
        (fixed_count(redis, "small"), fixed_count(redis, "large")),
        (5, 20)
    );
    assert_eq!(envoy.stat("cluster.multiservice.ratelimit.error"), 0);
}
