//! A limit hung on one axum route with `route_layer` (`RateLimitLayer::for_route`): that
//! route is limited, the routes beside it are not, and the 429 is the middleware's.

use std::sync::Arc;
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use edge_middleware::{Limiter, RateLimitLayer, SubjectSource};
use shared_contract::{PolicySet, RateLimitPolicy, SystemClock};
use tower::ServiceExt as _;

fn router() -> axum::Router {
    let login = RateLimitPolicy::fixed_window("login", 2)
        .per(Duration::from_secs(60))
        .build()
        .expect("valid");
    let id = login.id().clone();
    let policies = PolicySet::new([login], id.clone()).expect("a set");
    let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
    let limiter = Limiter::builder(Arc::new(port)).build();
    axum::Router::new()
        .route("/login", axum::routing::post(|| async { "welcome" }))
        .route_layer(RateLimitLayer::for_route(
            Arc::new(limiter),
            id,
            SubjectSource::Header("x-api-key".into()),
        ))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
}

async fn status(app: &axum::Router, method: &str, path: &str, key: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", key)
        .body(Body::empty())
        .expect("a request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

#[tokio::test]
async fn only_the_route_with_the_layer_is_limited() {
    let app = router();
    let mut login = Vec::new();
    for _ in 0..3 {
        login.push(status(&app, "POST", "/login", "k").await);
    }
    assert_eq!(
        login,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        status(&app, "POST", "/login", "other").await,
        StatusCode::OK,
        "per subject"
    );
    for _ in 0..5 {
        assert_eq!(status(&app, "GET", "/healthz", "k").await, StatusCode::OK);
    }
    // An unknown path is axum's 404, not a limit: the layer runs on its route only.
    assert_eq!(
        status(&app, "POST", "/nowhere", "k").await,
        StatusCode::NOT_FOUND
    );
}
