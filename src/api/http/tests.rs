//! The routes through [`router`], without a socket: each request is one `oneshot` call.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use tower::ServiceExt as _;

use super::*;

fn state(token: Option<&str>) -> HttpState {
    HttpState {
        metrics: Metrics::new(&[]),
        health: Arc::new(Health::default()),
        query: None,
        requests: None,
        tokens: Arc::new(Tokens {
            token: token.map(str::to_string),
            admin: None,
        }),
    }
}

/// The answer to `GET path` (with `bearer` as the token when given): status, content type, body.
async fn get(app: &Router, path: &str, bearer: Option<&str>) -> (StatusCode, String, String) {
    let mut request = Request::get(path);
    if let Some(token) = bearer {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map_or(String::new(), |v| v.to_str().unwrap().to_string());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, content_type, String::from_utf8_lossy(&body).into())
}

#[tokio::test]
async fn health_answers_and_unknown_routes_and_methods_are_problems() {
    let app = router(&HttpConfig::default(), state(None));
    assert_eq!(
        get(&app, "/health/live", None).await,
        (
            StatusCode::OK,
            "text/plain; charset=utf-8".into(),
            "ok\n".into()
        )
    );
    let (status, content_type, body) = get(&app, "/no/such/route", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(content_type, "application/problem+json");
    assert!(body.contains("no such route"), "{body}");
    let post = Request::post("/health/live").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(post).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn v1_needs_the_token_when_one_is_set_and_health_and_metrics_do_not() {
    let app = router(&HttpConfig::default(), state(Some("s3cret")));
    let (status, content_type, _) = get(&app, "/v1/count?counter=c", None).await;
    assert_eq!(
        (status, content_type.as_str()),
        (StatusCode::UNAUTHORIZED, "application/problem+json")
    );
    let (status, _, _) = get(&app, "/v1/count?counter=c", Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // With the token: past the gate, to the handler (no queries configured here).
    let (status, _, body) = get(&app, "/v1/count?counter=c", Some("s3cret")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("queries are not enabled"), "{body}");
    assert_eq!(get(&app, "/health/live", None).await.0, StatusCode::OK);
    // Every answer above is counted by its route's template, the unknown ones as `unmatched`.
    let (status, _, metrics) = get(&app, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    let line = |route: &str, code: &str| {
        format!("tally_http_answers_total{{code=\"{code}\",method=\"GET\",route=\"{route}\"}}")
    };
    assert!(
        metrics.contains(&format!("{} 2", line("/v1/count", "401"))),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("{} 1", line("/v1/count", "404"))),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("{} 1", line("/health/live", "200"))),
        "{metrics}"
    );
}
