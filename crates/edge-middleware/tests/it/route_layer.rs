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
    let request = Request::builder().method(method).uri(path);
    send(app, request.header("x-api-key", key)).await
}

async fn send(app: &axum::Router, request: axum::http::request::Builder) -> StatusCode {
    let request = request.body(Body::empty()).expect("a request");
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

/// A limiter of `user` (2 per minute) and `tenant` (3 per minute).
fn user_and_tenant() -> Arc<Limiter> {
    let minute = Duration::from_secs(60);
    let user = RateLimitPolicy::fixed_window("user", 2).per(minute).build();
    let tenant = RateLimitPolicy::fixed_window("tenant", 3)
        .per(minute)
        .build();
    let (user, tenant) = (user.expect("valid"), tenant.expect("valid"));
    let id = user.id().clone();
    let policies = PolicySet::new([user, tenant], id).expect("a set");
    let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
    Arc::new(Limiter::builder(Arc::new(port)).build())
}

async fn report(app: &axum::Router, user: &str, tenant: &str) -> StatusCode {
    let request = Request::builder().uri("/reports").header("x-user", user);
    send(app, request.header("X-Tenant", tenant)).await
}

#[tokio::test]
async fn two_limits_on_one_route_are_all_or_nothing() {
    let limiter = user_and_tenant();
    let layer = RateLimitLayer::for_policies(
        &limiter,
        [
            ("user", SubjectSource::header("X-User")),
            ("tenant", SubjectSource::header("x-tenant")),
        ],
    )
    .expect("both policies exist");
    let app = axum::Router::new().route(
        "/reports",
        axum::routing::get(|| async { "report" }).route_layer(layer),
    );
    let ok = StatusCode::OK;
    let denied = StatusCode::TOO_MANY_REQUESTS;
    // Alice uses her 2; her third is refused by `user` and charges `tenant` nothing, so Bob
    // still gets the tenant's third.
    assert_eq!(report(&app, "alice", "t1").await, ok);
    assert_eq!(report(&app, "alice", "t1").await, ok);
    assert_eq!(report(&app, "alice", "t1").await, denied);
    assert_eq!(report(&app, "bob", "t1").await, ok);
    // Now the tenant's 3 are used: Carol, with all of her own left, is refused by `tenant`.
    assert_eq!(report(&app, "carol", "t1").await, denied);
    assert_eq!(report(&app, "carol", "t2").await, ok);
}

#[test]
fn an_id_the_limiter_lacks_is_refused_when_the_layer_is_made() {
    let limiter = user_and_tenant();
    let e = RateLimitLayer::for_policies(
        &limiter,
        [
            ("user", SubjectSource::header("x-user")),
            ("tennant", SubjectSource::header("x-tenant")),
        ],
    )
    .expect_err("no such policy");
    assert_eq!(e.id, "tennant");
    assert_eq!(
        e.to_string(),
        "no policy \"tennant\" in this limiter; it has: tenant, user"
    );
    let e = RateLimitLayer::for_policies(&limiter, [("", SubjectSource::Ip)]).expect_err("empty");
    assert_eq!(e.id, "");
}
