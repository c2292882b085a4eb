//! A blocking HTTP client for the servers the tests and the benchmark start on loopback (tally,
//! Prometheus), on `ureq`. Each request opens its own connection and closes it after the
//! answer: the tests count tally's connections (its limit and its header timeout), so no idle
//! connection may stay pooled between two requests.

use std::time::Duration;

/// An answer: status, headers and the body as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The headers as `name: value` lines, for assertions on several and failure messages.
    pub fn head(&self) -> String {
        self.headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect()
    }
}

/// A client with one time limit for a whole exchange (connect, send, read the body).
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
}

impl Default for Client {
    /// 30 s: longer than any answer a test waits for, short enough to fail a stuck test.
    fn default() -> Client {
        Client::new(Duration::from_secs(30))
    }
}

impl Client {
    pub fn new(timeout: Duration) -> Client {
        let config = ureq::Agent::config_builder()
            // A 4xx or 5xx is an answer the tests check, not an error.
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_idle_connections(0)
            .max_idle_connections_per_host(0)
            .build();
        Client {
            agent: config.new_agent(),
        }
    }

    /// `GET target` (path and query) on 127.0.0.1:`port`, with extra `(name, value)` headers.
    pub fn get(
        &self,
        port: u16,
        target: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, ureq::Error> {
        let mut request = self.agent.get(url(port, target));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read(request.call()?)
    }

    /// `POST target` with `body` as is, under `content_type` (None: no Content-Type header).
    pub fn post(
        &self,
        port: u16,
        target: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> Result<Answer, ureq::Error> {
        let mut request = self.agent.post(url(port, target));
        if let Some(t) = content_type {
            request = request.content_type(t);
        }
        read(request.send(body)?)
    }

    /// `POST target` with a JSON body.
    /// `POST target` with `headers` (a bearer token, a content type) and `body`.
    pub fn post_with(
        &self,
        port: u16,
        target: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Answer, ureq::Error> {
        let mut request = self.agent.post(url(port, target));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read(request.send(body)?)
    }

    pub fn post_json(&self, port: u16, target: &str, json: &str) -> Result<Answer, ureq::Error> {
        let answer = self
            .agent
            .post(url(port, target))
            .content_type("application/json")
            .send(json)?;
        read(answer)
    }
}

fn url(port: u16, target: &str) -> String {
    format!("http://127.0.0.1:{port}{target}")
}

fn read(mut answer: ureq::http::Response<ureq::Body>) -> Result<Answer, ureq::Error> {
    let status = answer.status().as_u16();
    let headers = answer
        .headers()
        .iter()
        .map(|(n, v)| {
            let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (n.as_str().to_string(), value)
        })
        .collect();
    let body = answer.body_mut().read_to_string()?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// `GET target` with the default client: status and body; None if nothing answers.
pub fn get(port: u16, target: &str) -> Option<(u16, String)> {
    request(port, target, &[]).map(|a| (a.status, a.body))
}

/// `GET target` with extra headers (`("Authorization", "Bearer x")`); None if nothing answers.
pub fn request(port: u16, target: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    Client::default().get(port, target, headers).ok()
}

/// `POST target` with a JSON body; None if nothing answers.
pub fn post_json(port: u16, target: &str, json: &str) -> Option<Answer> {
    Client::default().post_json(port, target, json).ok()
}

/// `path?k=v&...` with the pairs form-urlencoded.
pub fn with_query(path: &str, pairs: &[(&str, &str)]) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    format!("{path}?{query}")
}
