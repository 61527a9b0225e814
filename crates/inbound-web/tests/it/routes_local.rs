//! `[[routes]]` rules end to end through the app's router, in process, over the local
//! provider: the configuration's conditions, subject lists and cost headers reach the
//! middleware, and two routes matching one request are one all-or-nothing evaluation.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use inbound_web::state::ApiState;
use tower::ServiceExt as _;

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "user"

[rate_limit.policies.user]
algorithm = "fixed_window"
limit = 5
window = "1h"
max_cost = 3

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[routes]]
path_prefix = "/api"
subject = "header:x-user"
cost = "header:x-cost"

[[routes]]
method = "POST"
path_prefix = "/api/tenants"
header = "x-tier=gold"
policy = "tenant"
subject = ["path:2", "const:gold"]
"#;

async fn app() -> axum::Router {
    let settings = app_bootstrap::config::from_toml(CONFIG).expect("valid");
    let limiter = app_bootstrap::build(&settings.rate_limit)
        .await
        .expect("built")
        .expect("enabled")
        .into_limiter();
    let state = Arc::new(ApiState::new(Some(Arc::new(limiter)), None));
    inbound_web::app::router(state, &settings.routes)
}

/// Sends a request; returns the status, the `RateLimit` field and the body.
async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    cost: &str,
    tier: Option<&str>,
) -> (StatusCode, String, String) {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header("x-user", "u-1")
        .header("x-cost", cost);
    if let Some(t) = tier {
        r = r.header("x-tier", t);
    }
    let response = app
        .clone()
        .oneshot(r.body(Body::empty()).expect("a request"))
        .await
        .expect("infallible");
    let status = response.status();
    let limit = response
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let ct = response.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("a body");
    if status.is_client_error() {
        assert_eq!(
            ct.as_ref().and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
    }
    (status, limit, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn configured_rules_limit_by_conditions_parts_and_cost_all_or_nothing() {
    let app = app().await;
    // GET does not meet the tenant route's method: the user route alone, cost 2.
    let (status, limit, _) = send(&app, "GET", "/api/tenants/t-9", "2", Some("gold")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(limit.starts_with("\"user\";r=3;"), "{limit}");
    // POST with x-tier gold: both routes, one evaluation.
    let (status, limit, _) = send(&app, "POST", "/api/tenants/t-9", "1", Some("gold")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        limit.starts_with("\"user\";r=2;") && limit.contains("\"tenant\";r=0;"),
        "{limit}"
    );
    // The tenant t-9 is exhausted: 429 naming it, and the user is not charged.
    let (status, limit, body) = send(&app, "POST", "/api/tenants/t-9", "1", Some("gold")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains(r#""violated-policies":["tenant"]"#), "{body}");
    assert!(
        limit.starts_with("\"user\";r=1;"),
        "would-be figure: {limit}"
    );
    // Another tenant segment is another subject; silver does not meet the header condition.
    let (status, _, _) = send(&app, "POST", "/api/tenants/t-8", "1", Some("gold")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, limit, _) = send(&app, "POST", "/api/tenants/t-9", "1", Some("silver")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!limit.contains("tenant"), "{limit}");
    // user: 5 - 2 - 1 - 1 - 1 = 0 left. A bad cost header is 400 naming it and charges nothing.
    for bad in ["0", "4", "x"] {
        let (status, _, body) = send(&app, "GET", "/api/x", bad, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(body.contains("x-cost"), "{body}");
    }
    let (status, _, _) = send(&app, "GET", "/api/x", "1", None).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the quota is spent exactly"
    );
}
