//! Tests of the middleware: failures, headers, subjects, and several routes as one evaluation.

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use shared_contract::{
    FailurePolicy, IncompatibleCategory, PolicySet, RateLimitPolicy, UnavailableCategory,
};
use tower::ServiceExt as _;

use super::*;
use crate::rule::{CostSource, HeaderCondition};
use crate::subject::{SubjectHasher, SubjectSecret, SubjectSource};
use shared_contract::PolicyId;
use shared_contract::testing::ScriptedPort;

/// A fixed-window policy of `limit` per `window_secs`.
fn fixed_window(
    name: &str,
    limit: u64,
    window_secs: u64,
    failure_policy: FailurePolicy,
) -> RateLimitPolicy {
    RateLimitPolicy::fixed_window(name, limit)
        .per(Duration::from_secs(window_secs))
        .failure_policy(failure_policy)
        .build()
        .expect("valid policy")
}

/// A port that never decides: every evaluation answers `outcome` for its policy.
fn failing(policies: PolicySet, outcome: fn(PolicyId) -> RateLimitOutcome) -> ScriptedPort {
    ScriptedPort::new(policies, move |r| Ok(outcome(r.policy_id.clone())))
}

fn service(
    failure_policy: FailurePolicy,
    outcome: fn(PolicyId) -> RateLimitOutcome,
) -> RateLimit<axum::routing::Router> {
    service_with(failure_policy, failure_policy, outcome)
}

/// The policy's own failure policy and the limiter's global one may differ.
fn service_with(
    own: FailurePolicy,
    failure_policy: FailurePolicy,
    outcome: fn(PolicyId) -> RateLimitOutcome,
) -> RateLimit<axum::routing::Router> {
    let id = PolicyId::new("api").expect("valid id");
    let policy = fixed_window("api", 5, 1, own);
    let port = Arc::new(failing(
        PolicySet::new([policy], id.clone()).expect("valid set"),
        outcome,
    ));
    let limiter = Arc::new(Limiter::new(
        port,
        SubjectHasher::new(&SubjectSecret::random()),
        failure_policy,
        Duration::from_secs(1),
    ));
    let upstream = axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" }));
    RateLimitLayer::new(
        limiter,
        vec![Rule::new("/api", id, SubjectSource::Header("x-key".into()))],
    )
    .layer(upstream)
}

fn unavailable(policy_id: PolicyId) -> RateLimitOutcome {
    RateLimitOutcome::Unavailable {
        policy_id,
        retry_after_ms: 1500,
        category: UnavailableCategory::Connect,
    }
}

fn incompatible(policy_id: PolicyId) -> RateLimitOutcome {
    RateLimitOutcome::Incompatible {
        policy_id,
        category: IncompatibleCategory::State,
    }
}

fn get() -> Request<Body> {
    Request::get("/api/x").body(Body::empty()).expect("request")
}

#[tokio::test]
async fn fail_closed_answers_503_with_retry_after_rounded_up() {
    let r = service(FailurePolicy::FailClosed, unavailable)
        .oneshot(get())
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    assert_eq!(r.headers()[header::CONTENT_TYPE], problem::CONTENT_TYPE);
    assert!(r.headers().get(headers::RATELIMIT).is_none());
}

#[tokio::test]
async fn a_policys_own_failure_policy_overrides_the_global_one() {
    let open = service_with(
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
        unavailable,
    )
    .oneshot(get())
    .await
    .expect("infallible");
    assert_eq!(open.status(), StatusCode::OK);
    let closed = service_with(
        FailurePolicy::FailClosed,
        FailurePolicy::FailOpen,
        unavailable,
    )
    .oneshot(get())
    .await
    .expect("infallible");
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn incompatible_under_fail_closed_is_503_without_a_retry_hint() {
    let r = service(FailurePolicy::FailClosed, incompatible)
        .oneshot(get())
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get(header::RETRY_AFTER).is_none());
}

#[tokio::test]
async fn fail_open_lets_the_request_through_without_claiming_a_decision() {
    let r = service(FailurePolicy::FailOpen, unavailable)
        .oneshot(get())
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get(headers::RATELIMIT).is_none());
    assert!(r.headers().get(headers::RATELIMIT_POLICY).is_none());
}

#[tokio::test]
async fn paths_outside_every_rule_are_not_evaluated() {
    // The failing port would answer 503 if it were asked.
    let r = service(FailurePolicy::FailClosed, unavailable)
        .oneshot(Request::get("/apix").body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn every_matching_policy_gets_a_list_member() {
    let policy = |name: &str, limit: u64| fixed_window(name, limit, 60, FailurePolicy::FailClosed);
    let a = PolicyId::new("a").expect("valid id");
    let b = PolicyId::new("b").expect("valid id");
    let policies =
        PolicySet::new([policy("a", 10), policy("b", 20)], a.clone()).expect("valid set");
    let port = Arc::new(ScriptedPort::allowing(policies, 7));
    let limiter = Limiter::new(
        port,
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    );
    let layer = RateLimitLayer::new(
        Arc::new(limiter),
        vec![
            Rule::new("/api", a, SubjectSource::Ip),
            Rule::new("/api/x", b, SubjectSource::Ip),
        ],
    );
    let upstream = axum::Router::new()
        .route("/api/x", axum::routing::get(|| async { "up" }))
        .route("/api/y", axum::routing::get(|| async { "up" }));
    let svc = layer.layer(upstream);
    let r = svc.clone().oneshot(get()).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()[headers::RATELIMIT_POLICY],
        "\"a\";q=10;w=60, \"b\";q=20;w=60"
    );
    let limit = r.headers()[headers::RATELIMIT].to_str().expect("ascii");
    assert!(limit.starts_with("\"a\";r=7;t=0, \"b\";r=7;t=0"), "{limit}");
    let r = svc
        .oneshot(Request::get("/api/y").body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    assert_eq!(r.headers()[headers::RATELIMIT_POLICY], "\"a\";q=10;w=60");
}

/// The layer of `rules` over the local provider with `policies` (the first is the default).
fn local_layer(policies: Vec<RateLimitPolicy>, rules: Vec<Rule>) -> RateLimitLayer {
    let default = policies[0].id().clone();
    let port = Arc::new(adapter_local::LocalProvider::new(
        PolicySet::new(policies, default).expect("valid set"),
        Arc::new(shared_contract::SystemClock),
        adapter_local::LocalSettings::default(),
    ));
    let limiter = Limiter::new(
        port,
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    );
    RateLimitLayer::new(Arc::new(limiter), rules)
}

/// The local provider behind one `ip` rule of 1 request per minute, reading the peer with
/// `peer` when given one.
fn ip_limited(peer: Option<PeerIp>) -> RateLimit<axum::routing::Router> {
    let id = PolicyId::new("api").expect("valid id");
    let policy = fixed_window("api", 1, 60, FailurePolicy::FailClosed);
    let mut layer = local_layer(vec![policy], vec![Rule::new("/api", id, SubjectSource::Ip)]);
    if let Some(peer) = peer {
        layer = layer.with_peer_ip(peer);
    }
    layer.layer(axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" })))
}

fn from_peer(last_octet: u8) -> Request<Body> {
    let mut r = get();
    let addr = std::net::SocketAddr::from(([10, 0, 0, last_octet], 40_000));
    r.extensions_mut().insert(axum::extract::ConnectInfo(addr));
    r
}

#[tokio::test]
async fn ip_subjects_are_the_address_the_peer_reader_finds() {
    let svc = ip_limited(Some(|e| {
        e.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip())
    }));
    let first = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    let again = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = svc.oneshot(from_peer(2)).await.expect("infallible");
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another peer, another quota"
    );
}

#[tokio::test]
async fn without_a_peer_reader_every_ip_subject_is_the_empty_one() {
    let svc = ip_limited(None);
    let first = svc.clone().oneshot(from_peer(1)).await.expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    let other = svc.oneshot(from_peer(2)).await.expect("infallible");
    assert_eq!(
        other.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one shared quota"
    );
}

#[tokio::test]
async fn an_oversized_subject_is_400_and_charges_no_rule() {
    let a = PolicyId::new("a").expect("valid id");
    let b = PolicyId::new("b").expect("valid id");
    let policies = vec![
        fixed_window("a", 3, 60, FailurePolicy::FailClosed),
        fixed_window("b", 3, 60, FailurePolicy::FailClosed),
    ];
    let header = |name: &str| SubjectSource::Header(name.into());
    let rules = vec![
        Rule::new("/api", a, header("x-key")),
        Rule::new("/api", b, header("x-user")),
    ];
    let svc = local_layer(policies, rules)
        .layer(axum::Router::new().route("/api/x", axum::routing::get(|| async { "up" })));
    let request = |user: &str| {
        Request::get("/api/x")
            .header("x-key", "k")
            .header("x-user", user)
            .body(Body::empty())
            .expect("request")
    };
    let long = "u".repeat(crate::MAX_SUBJECT_BYTES + 1);
    let r = svc
        .clone()
        .oneshot(request(&long))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()[header::CONTENT_TYPE], problem::CONTENT_TYPE);
    assert!(r.headers().get(headers::RATELIMIT).is_none());
    let r = svc
        .clone()
        .oneshot(request(&long[1..]))
        .await
        .expect("infallible");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "256 bytes is the bound, not beyond it"
    );
    let limit = r.headers()[headers::RATELIMIT].to_str().expect("ascii");
    assert!(
        limit.starts_with("\"a\";r=2;"),
        "rule a was not charged by the 400: {limit}"
    );
}

/// A fixed-window policy of `limit` per minute that takes costs up to `max_cost`.
fn costly(name: &str, limit: u64, max_cost: u64) -> RateLimitPolicy {
    RateLimitPolicy::fixed_window(name, limit)
        .per(Duration::from_secs(60))
        .max_cost(max_cost)
        .build()
        .expect("valid policy")
}

/// One request to `path` with `headers`.
fn request(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::get(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::empty()).expect("request")
}

async fn text(r: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
        .await
        .expect("a body");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn upstream() -> axum::Router {
    axum::Router::new()
        .route("/api/x", axum::routing::get(|| async { "up" }))
        .route("/api/y", axum::routing::get(|| async { "up" }))
}

/// Route A (`/api`, 1 per minute) and route B (`/api/x`, 5 per minute), both by `x-key`.
fn a_and_b() -> RateLimit<axum::Router> {
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let key = || SubjectSource::Header("x-key".into());
    local_layer(
        vec![
            fixed_window("a", 1, 60, FailurePolicy::FailClosed),
            fixed_window("b", 5, 60, FailurePolicy::FailClosed),
        ],
        vec![
            Rule::new("/api", id("a"), key()),
            Rule::new("/api/x", id("b"), key()),
        ],
    )
    .layer(upstream())
}

#[tokio::test]
async fn several_matching_routes_are_all_or_nothing() {
    let svc = a_and_b();
    let k = [("x-key", "k1")];
    let first = svc
        .clone()
        .oneshot(request("/api/x", &k))
        .await
        .expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    let limit = first.headers()[headers::RATELIMIT]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        limit.starts_with("\"a\";r=0;") && limit.contains(", \"b\";r=4;"),
        "{limit}"
    );
    // A is exhausted: the request is refused, and B is not charged.
    for _ in 0..3 {
        let denied = svc
            .clone()
            .oneshot(request("/api/x", &k))
            .await
            .expect("infallible");
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        let limit = denied.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(
            limit.contains("\"b\";r=3;"),
            "B would have had 3 left after a charge: {limit}"
        );
        let body: serde_json::Value =
            serde_json::from_str(&text(denied).await).expect("problem+json");
        assert_eq!(body["violated-policies"], serde_json::json!(["a"]));
    }
    // Another subject: both admit, and B's count shows it was never charged for k1 beyond 1.
    let other = svc
        .clone()
        .oneshot(request("/api/x", &[("x-key", "k2")]))
        .await
        .expect("infallible");
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(
        other.headers()[headers::RATELIMIT_POLICY],
        "\"a\";q=1;w=60, \"b\";q=5;w=60"
    );
}

#[tokio::test]
async fn a_429_names_every_violated_policy_and_waits_for_the_latest() {
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let key = || SubjectSource::Header("x-key".into());
    let svc = local_layer(
        vec![
            fixed_window("a", 1, 60, FailurePolicy::FailClosed),
            fixed_window("b", 1, 120, FailurePolicy::FailClosed),
            fixed_window("c", 9, 60, FailurePolicy::FailClosed),
        ],
        vec![
            Rule::new("/api", id("a"), key()),
            Rule::new("/api", id("b"), key()),
            Rule::new("/api/x", id("c"), key()),
        ],
    )
    .layer(upstream());
    let k = [("x-key", "k")];
    assert_eq!(
        svc.clone()
            .oneshot(request("/api/y", &k))
            .await
            .expect("infallible")
            .status(),
        StatusCode::OK
    );
    let denied = svc
        .oneshot(request("/api/x", &k))
        .await
        .expect("infallible");
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = denied.headers()[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    let limit = denied.headers()[headers::RATELIMIT]
        .to_str()
        .expect("ascii")
        .to_owned();
    let ts: Vec<u64> = limit
        .split(", ")
        .take(2)
        .map(|m| {
            m.rsplit_once(";t=")
                .expect("a denied member has t")
                .1
                .parse()
                .expect("seconds")
        })
        .collect();
    assert_eq!(retry, ts[0].max(ts[1]), "the later of the two: {limit}");
    let body: serde_json::Value = serde_json::from_str(&text(denied).await).expect("problem+json");
    assert_eq!(body["violated-policies"], serde_json::json!(["a", "b"]));
}

#[tokio::test]
async fn composed_subjects_costs_and_conditions_apply_per_request() {
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let p = costly("t", 10, 5);
    let rule = Rule::new("/api", id("t"), SubjectSource::Ip)
        .with_subject([
            SubjectSource::Header("x-tenant".into()),
            SubjectSource::PathSegment(1),
        ])
        .with_headers([HeaderCondition::parse("x-tenant").expect("valid")])
        .with_cost(CostSource::parse_header("header:x-cost").expect("valid"));
    let svc = local_layer(vec![p], vec![rule]).layer(upstream());
    let call = |tenant: &str, path: &str, cost: Option<&str>| {
        let mut h = vec![("x-tenant", tenant)];
        if let Some(c) = cost {
            h.push(("x-cost", c));
        }
        svc.clone().oneshot(request(path, &h))
    };
    let r = call("ab", "/api/x", Some("4")).await.expect("infallible");
    assert!(
        r.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .starts_with("\"t\";r=6;")
    );
    // ("a", "b/x") is not ("ab", "x"): another subject, a fresh quota.
    let r = call("a", "/api/x", Some("1")).await.expect("infallible");
    assert!(
        r.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .starts_with("\"t\";r=9;")
    );
    for bad in [None, Some("0"), Some("6"), Some("x"), Some("-1")] {
        let r = call("ab", "/api/x", bad).await.expect("infallible");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        assert!(r.headers().get(headers::RATELIMIT).is_none());
        let body = text(r).await;
        assert!(
            body.contains("x-cost") && body.contains("invalid_cost"),
            "{body}"
        );
    }
    let r = call("ab", "/api/y", Some("1")).await.expect("infallible");
    assert!(
        r.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .starts_with("\"t\";r=9;"),
        "another path segment, another subject; the 400s charged nothing"
    );
    let r = call("ab", "/api/x", Some("5")).await.expect("infallible");
    assert!(
        r.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .starts_with("\"t\";r=1;")
    );
    // Without x-tenant the rule does not match: not limited at all.
    let r = svc
        .clone()
        .oneshot(request("/api/x", &[]))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get(headers::RATELIMIT).is_none());
}

#[tokio::test]
async fn more_routes_than_one_evaluation_takes_is_500_and_charges_nothing() {
    let names: Vec<String> = (0..=shared_contract::MAX_LIMITS)
        .map(|i| format!("p{i}"))
        .collect();
    let policies = names
        .iter()
        .map(|n| fixed_window(n, 5, 60, FailurePolicy::FailClosed))
        .collect();
    let rules = names
        .iter()
        .map(|n| Rule::new("/api", PolicyId::new(n).expect("valid"), SubjectSource::Ip))
        .collect();
    let svc = local_layer(policies, rules).layer(upstream());
    let r = svc
        .oneshot(request("/api/x", &[]))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.headers()[header::CONTENT_TYPE], problem::CONTENT_TYPE);
}

#[tokio::test]
async fn two_routes_charging_one_key_are_one_limit_of_their_summed_cost() {
    let id = PolicyId::new("a").expect("valid id");
    let p = costly("a", 10, 3);
    let key = || SubjectSource::Header("x-key".into());
    let svc = local_layer(
        vec![p],
        vec![
            Rule::new("/api", id.clone(), key()),
            Rule::new("/api/x", id, key())
                .with_cost(CostSource::Fixed(Cost::new(2).expect("valid"))),
        ],
    )
    .layer(upstream());
    let r = svc
        .oneshot(request("/api/x", &[("x-key", "k")]))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[headers::RATELIMIT_POLICY], "\"a\";q=10;w=60");
    assert!(
        r.headers()[headers::RATELIMIT]
            .to_str()
            .expect("ascii")
            .starts_with("\"a\";r=7;")
    );
}

/// The `RateLimit` field of a response.
fn limit_field(r: &Response<Body>) -> String {
    r.headers()[headers::RATELIMIT]
        .to_str()
        .expect("ascii")
        .to_owned()
}

#[tokio::test]
async fn a_shadow_route_is_charged_and_never_denies() {
    let id = PolicyId::new("a").expect("valid id");
    let svc = local_layer(
        vec![fixed_window("a", 1, 60, FailurePolicy::FailClosed)],
        vec![Rule::new("/api", id, SubjectSource::Header("x-key".into())).with_shadow(true)],
    )
    .layer(upstream());
    for i in 0..3 {
        let r = svc
            .clone()
            .oneshot(request("/api/x", &[("x-key", "k")]))
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        assert!(
            limit_field(&r).starts_with("\"a\";r=0;"),
            "{}",
            limit_field(&r)
        );
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}

#[tokio::test]
async fn a_shadow_policy_lets_requests_through_when_its_provider_cannot_decide() {
    let id = PolicyId::new("api").expect("valid id");
    let policy = fixed_window("api", 5, 1, FailurePolicy::FailClosed).with_shadow(true);
    let port = Arc::new(failing(
        PolicySet::new([policy], id.clone()).expect("valid set"),
        unavailable,
    ));
    let limiter = Arc::new(Limiter::new(
        port,
        SubjectHasher::new(&SubjectSecret::random()),
        FailurePolicy::FailClosed,
        Duration::from_secs(1),
    ));
    let r = RateLimitLayer::new(
        limiter,
        vec![Rule::new("/api", id, SubjectSource::Header("x-key".into()))],
    )
    .layer(upstream())
    .oneshot(get())
    .await
    .expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get(headers::RATELIMIT).is_none(), "no decision");
}

/// Enforced `a` (1 per minute, only with an `x-enforce` header) and shadow `b` (`limit`
/// per minute), both on `/api` by `x-key`.
fn enforced_and_shadow(b_limit: u64) -> RateLimit<axum::Router> {
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let key = || SubjectSource::Header("x-key".into());
    local_layer(
        vec![
            fixed_window("a", 1, 60, FailurePolicy::FailClosed),
            fixed_window("b", b_limit, 60, FailurePolicy::FailClosed).with_shadow(true),
        ],
        vec![
            Rule::new("/api", id("a"), key())
                .with_headers([HeaderCondition::Present("x-enforce".into())]),
            Rule::new("/api", id("b"), key()),
        ],
    )
    .layer(upstream())
}

#[tokio::test]
async fn a_refused_request_charges_no_shadow_limit() {
    let svc = enforced_and_shadow(5);
    let both = [("x-key", "k"), ("x-enforce", "1")];
    let first = svc
        .clone()
        .oneshot(request("/api/x", &both))
        .await
        .expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    let field = limit_field(&first);
    assert!(
        field.starts_with("\"a\";r=0;") && field.contains(", \"b\";r=4;"),
        "{field}"
    );
    let refused = svc
        .clone()
        .oneshot(request("/api/x", &both))
        .await
        .expect("infallible");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: serde_json::Value = serde_json::from_str(&text(refused).await).expect("json");
    assert_eq!(body["violated-policies"], serde_json::json!(["a"]));
    // Only the shadow rule matches now: b was charged once, by the admitted request.
    let shadow_only = svc
        .clone()
        .oneshot(request("/api/x", &[("x-key", "k")]))
        .await
        .expect("infallible");
    assert_eq!(shadow_only.status(), StatusCode::OK);
    assert!(limit_field(&shadow_only).starts_with("\"b\";r=3;"));
}

#[tokio::test]
async fn a_shadow_denial_does_not_keep_the_enforced_limits_from_being_charged() {
    let id = |n: &str| PolicyId::new(n).expect("valid id");
    let key = || SubjectSource::Header("x-key".into());
    let svc = local_layer(
        vec![
            fixed_window("a", 5, 60, FailurePolicy::FailClosed),
            fixed_window("b", 1, 60, FailurePolicy::FailClosed),
        ],
        vec![
            Rule::new("/api", id("a"), key()),
            Rule::new("/api", id("b"), key()).with_shadow(true),
        ],
    )
    .layer(upstream());
    for (i, a_left) in [4, 3, 2].into_iter().enumerate() {
        let r = svc
            .clone()
            .oneshot(request("/api/x", &[("x-key", "k")]))
            .await
            .expect("infallible");
        assert_eq!(r.status(), StatusCode::OK, "request {i}: b never denies");
        let field = limit_field(&r);
        assert!(
            field.starts_with(&format!("\"a\";r={a_left};")) && field.contains(", \"b\";r=0;"),
            "request {i}: a charged every time: {field}"
        );
    }
}
