//! The middleware when the provider cannot decide a request limited by several rules whose
//! policies fail open and closed alike: the rule of `edge_middleware::failure`, the same as
//! the HTTP list form's and the gRPC service's.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use edge_middleware::{Limiter, RateLimitLayer, Rule, SubjectHasher, SubjectSecret, SubjectSource};
use shared_contract::testing::ScriptedPort;
use shared_contract::{
    AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySet, PolicySpec, RateLimitPolicy,
    UnavailableCategory,
};
use tower::{Layer as _, ServiceExt as _};

fn policy(id: &str, failure_policy: FailurePolicy) -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new(id).expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: 5,
            window: Duration::from_secs(60),
        },
        max_cost: 1,
        cleanup_grace: Duration::ZERO,
        max_clock_regression: Duration::ZERO,
        failure_policy,
    })
    .expect("valid policy")
}

#[tokio::test]
async fn a_mixed_failure_is_answered_for_the_first_fail_closed_policy() {
    // `open` fails open and comes first; `fw` fails closed: the strictest decides, and the
    // 503 names it although the provider failed at `open`.
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let key = || SubjectSource::Header("x-key".into());
    let policies = PolicySet::new(
        [
            policy("open", FailurePolicy::FailOpen),
            policy("fw", FailurePolicy::FailClosed),
        ],
        id("open"),
    )
    .expect("valid set");
    let limiter = Arc::new(Limiter::new(
        // Never reachable; a multi-limit evaluation fails at its first limit.
        Arc::new(ScriptedPort::unavailable(
            policies,
            UnavailableCategory::Connect,
            1500,
        )),
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    ));
    let upstream = axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" }));
    let r = RateLimitLayer::new(
        limiter,
        vec![
            Rule::new("/api", id("open"), key()),
            Rule::new("/api", id("fw"), key()),
        ],
    )
    .layer(upstream)
    .oneshot(
        Request::get("/api/x")
            .header("x-key", "k")
            .body(Body::empty())
            .expect("request"),
    )
    .await
    .expect("infallible");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
        .await
        .expect("a body");
    let body: serde_json::Value = serde_json::from_slice(&bytes).expect("problem+json");
    assert_eq!(body["policy"], "fw", "{body}");
}
