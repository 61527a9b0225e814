//! `POST /v1/evaluate` list form and `evaluation_id` over the local provider, through the
//! app's router in process: all-or-nothing (a denial charges no entry), the exact body shape,
//! replays that answer the first decision with `"replayed":true` and charge nothing more, and
//! bad lists refused with 400 problem+json naming the entry, charging nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use inbound_web::state::ApiState;
use serde_json::{Value, json};
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
max_cost = 2

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 1
window = "1h"
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

/// Posts `body` to `/v1/evaluate`: status, `Retry-After`, content type, JSON body.
async fn post(app: &axum::Router, body: &Value) -> (StatusCode, Option<u64>, String, Value) {
    let request = Request::post("/v1/evaluate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request");
    let r = app.clone().oneshot(request).await.expect("infallible");
    let status = r.status();
    let retry = r
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let content_type = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20)
        .await
        .expect("a body");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry, content_type, v)
}

/// The remaining quota of `policy` for `subject`, charging 1 (a single-form evaluation).
async fn remaining_after_one(app: &axum::Router, policy: &str, subject: &str) -> Value {
    let (_, _, _, v) = post(app, &json!({"policy": policy, "subject": subject})).await;
    v["remaining"].clone()
}

fn two(user: &str, tenant: &str) -> Value {
    json!({"requests": [
        {"policy": "user", "subject": user, "cost": 1},
        {"policy": "tenant", "subject": tenant},
    ]})
}

#[tokio::test]
async fn the_list_form_is_all_or_nothing_with_one_decision_per_entry() {
    let app = app().await;
    let (status, retry, ct, v) = post(&app, &two("u-1", "t-9")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(retry, None);
    assert_eq!(ct, "application/json");
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["allowed", "decisions", "outcome", "violated_policies"],
        "{v}"
    );
    assert_eq!(v["outcome"], "evaluated");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["violated_policies"], json!([]));
    let d = v["decisions"].as_array().expect("decisions");
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0]["policy"].clone(), d[0]["remaining"].clone()),
        (json!("user"), json!(4))
    );
    assert_eq!(
        (d[1]["policy"].clone(), d[1]["remaining"].clone()),
        (json!("tenant"), json!(0))
    );
    assert_eq!(d[0]["outcome"], "evaluated");

    // The tenant is exhausted: denied, and the user is not charged.
    for _ in 0..2 {
        let (status, retry, _, v) = post(&app, &two("u-1", "t-9")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert!(retry.is_some_and(|s| s >= 1), "{retry:?}");
        assert_eq!(v["allowed"], false);
        assert_eq!(v["violated_policies"], json!(["tenant"]));
        assert_eq!(
            v["decisions"][0]["allowed"], true,
            "the user would have admitted"
        );
        assert_eq!(v["decisions"][1]["allowed"], false);
    }
    assert_eq!(
        remaining_after_one(&app, "user", "u-1").await,
        3,
        "the user was charged by the first list only"
    );
}

#[tokio::test]
async fn an_evaluation_id_replays_the_first_decision_and_charges_nothing_more() {
    let app = app().await;
    let single = json!({"policy": "user", "subject": "u-7", "cost": 2, "evaluation_id": "pay-1"});
    let (status, _, _, first) = post(&app, &single).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["remaining"], 3);
    assert!(first.get("replayed").is_none(), "{first}");
    let (status, _, _, again) = post(&app, &single).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["remaining"], 3);
    assert_eq!(remaining_after_one(&app, "user", "u-7").await, 2);

    let mut list = two("u-8", "t-8");
    list["evaluation_id"] = json!("order-42");
    let (status, _, _, first) = post(&app, &list).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(first.get("replayed").is_none());
    let (status, _, _, again) = post(&app, &list).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the tenant's 1 was not charged again: {again}"
    );
    assert_eq!(again["replayed"], true);
    assert_eq!(again["decisions"], first["decisions"]);
    // Without the id the same list is a new evaluation: the tenant is exhausted.
    let (status, _, _, _) = post(&app, &two("u-8", "t-8")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(remaining_after_one(&app, "user", "u-8").await, 3);
}

#[tokio::test]
async fn bad_lists_are_400_naming_the_entry_and_charge_nothing() {
    let app = app().await;
    let entry = |policy: &str, subject: &str| json!({"policy": policy, "subject": subject});
    let nine: Vec<Value> = (0..9).map(|i| entry("user", &format!("u-{i}"))).collect();
    let cases = [
        (json!({"requests": []}), "no_requests", "at least one"),
        (json!({"requests": nine}), "too_many_limits", "9 entries"),
        (
            json!({"requests": [entry("user", "u-1"), entry("tenant", "t"), entry("user", "u-1")]}),
            "duplicate_limit",
            "requests[2] repeats policy user and subject of requests[0]",
        ),
        (
            json!({"requests": [entry("user", "u-1"), entry("nope", "t")]}),
            "unknown_policy",
            "requests[1]: unknown policy \"nope\"",
        ),
        (
            json!({"requests": [entry("user", "u-1"), {"policy": "tenant", "subject": "t", "cost": 2}]}),
            "invalid_cost",
            "requests[1]: cost must be between 1 and max_cost 1 of policy tenant, got 2",
        ),
        (
            json!({"requests": [{"policy": "user"}]}),
            "missing_subject",
            "requests[0]: subject is required",
        ),
        (
            json!({"requests": [entry("user", "u-1"), entry("tenant", "")]}),
            "missing_subject",
            "requests[1]: subject must not be empty",
        ),
        (
            json!({"requests": [entry("user", "u-1")], "policy": "user"}),
            "mixed_forms",
            "not both",
        ),
        (
            json!({"requests": [entry("user", "u-1")], "evaluation_id": "e".repeat(129)}),
            "invalid_evaluation_id",
            "1..=128",
        ),
        (
            json!({"subject": "u-1", "evaluation_id": ""}),
            "invalid_evaluation_id",
            "1..=128",
        ),
    ];
    for (body, error, detail) in cases {
        let (status, _, ct, v) = post(&app, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(ct, "application/problem+json");
        assert_eq!(v["error"], error, "{v}");
        let d = v["detail"].as_str().unwrap_or_default();
        assert!(d.contains(detail), "{d}");
    }
    assert_eq!(
        remaining_after_one(&app, "user", "u-1").await,
        4,
        "nothing was charged"
    );
    assert_eq!(remaining_after_one(&app, "tenant", "t").await, 0);
}

#[tokio::test]
async fn a_list_entry_that_is_an_array_is_malformed_json_and_charges_nothing() {
    let app = app().await;
    for body in [
        json!({"requests": [["user", "u-1", 2]]}),
        json!({"requests": [{"policy": "tenant", "subject": "t"}, ["user", "u-1"]]}),
        json!([["user", "u-1", 1]]),
    ] {
        let (status, _, ct, v) = post(&app, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(ct, "application/problem+json");
        assert_eq!(v["error"], "malformed_json", "{body}: {v}");
    }
    assert_eq!(
        remaining_after_one(&app, "user", "u-1").await,
        4,
        "nothing was charged"
    );
    assert_eq!(
        remaining_after_one(&app, "tenant", "t").await,
        0,
        "the tenant's one place was still free"
    );
}
