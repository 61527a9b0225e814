//! Fuzzing the JSON bodies of `POST /v1/evaluate` (single and list form) and
//! `POST /v1/gates/{gate}/events`
//! through the app's router (in process, `oneshot`, over the local providers): arbitrary
//! bytes and JSON built from the real field names with values of every type and edge. The
//! app never panics and never answers 500; every refusal is a short problem+json.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use inbound_web::gates::GateApi;
use inbound_web::state::ApiState;
use proptest::prelude::*;
use tower::ServiceExt as _;

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 1000000
window = "60s"
max_cost = 5

[rate_limit.policies.other]
algorithm = "token_bucket"
capacity = 1000000
refill_amount = 1
refill_interval = "1s"

[event_gates.orders]
mode = "only_once"
duration = "1h"
"#;

struct App {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

fn app() -> &'static App {
    static APP: std::sync::OnceLock<App> = std::sync::OnceLock::new();
    APP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let settings = app_bootstrap::config::from_toml(CONFIG).expect("valid");
        let router = runtime.block_on(async {
            let limiter = app_bootstrap::build(&settings.rate_limit)
                .await
                .expect("built")
                .expect("enabled")
                .into_limiter();
            let gates = app_bootstrap::build_gates(&settings)
                .await
                .expect("built")
                .expect("a gate");
            let state = Arc::new(ApiState::new(Some(Arc::new(limiter)), None));
            let gates = Arc::new(GateApi::new(Some(Arc::new(gates))));
            inbound_web::app::router_with_gates(state, &settings.routes, gates)
        });
        App { runtime, router }
    })
}

/// Posts `body` to `path`; checks that a refusal is a short problem+json, and returns the
/// status.
fn post(path: &str, body: Vec<u8>) -> Result<StatusCode, TestCaseError> {
    let app = app();
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a request");
    let (status, content_type, bytes) = app.runtime.block_on(async {
        let r = app
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = r.status();
        let content_type = r.headers().get(header::CONTENT_TYPE).cloned();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20)
            .await
            .expect("a body");
        (status, content_type, bytes)
    });
    let text = String::from_utf8_lossy(&bytes);
    prop_assert!(!status.is_server_error(), "{path}: {status} {text}");
    if status.is_client_error() {
        prop_assert_eq!(
            content_type.as_ref().and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{}: {} {}",
            path,
            status,
            text
        );
        prop_assert!(bytes.len() < 2048, "{path}: a {}-byte refusal", bytes.len());
        prop_assert!(
            serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(),
            "{text}"
        );
    }
    Ok(status)
}

/// JSON values of every type, with strings that are near the limits and escapes.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(5),
            Just(6),
            Just(-1),
            Just(i64::MAX),
            Just(i64::MIN),
            any::<i64>()
        ]
        .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("api".to_owned()),
            Just("nope".to_owned()),
            Just(String::new()),
            "[a-z0-9_-]{1,20}",
            (0usize..600).prop_map(|n| "k".repeat(n)),
            any::<String>(),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object of some of `fields` (and maybe an unknown one), with any values.
fn body(fields: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let field = (prop::sample::select(fields.to_vec()), json_value());
    (
        prop::collection::vec(field, 0..4),
        prop::option::weighted(0.1, ("[a-z]{1,6}", json_value())),
    )
        .prop_map(|(fields, extra)| {
            let mut object = serde_json::Map::new();
            for (k, v) in fields {
                object.insert(k.to_owned(), v);
            }
            if let Some((k, v)) = extra {
                object.insert(k, v);
            }
            serde_json::Value::Object(object).to_string().into_bytes()
        })
}

/// A list-form body: `requests` (entries of the single form's fields, often valid, or any
/// value), maybe an `evaluation_id` of any value, sometimes a single-form field as well.
fn list_body() -> impl Strategy<Value = Vec<u8>> {
    use serde_json::{Value, json};
    let entry = (
        prop::option::of(prop_oneof![Just("api"), Just("other"), Just("nope")]),
        prop::option::of(prop_oneof![Just("u-1"), Just("u-2"), Just("")]),
        prop::option::of(prop_oneof![
            Just(json!(1)),
            Just(json!(5)),
            Just(json!(6)),
            json_value()
        ]),
    )
        .prop_map(|(policy, subject, cost)| {
            let mut o = serde_json::Map::new();
            if let Some(p) = policy {
                o.insert("policy".into(), p.into());
            }
            if let Some(s) = subject {
                o.insert("subject".into(), s.into());
            }
            if let Some(c) = cost {
                o.insert("cost".into(), c);
            }
            Value::Object(o)
        });
    let requests = prop_oneof![
        4 => prop::collection::vec(entry, 0..11).prop_map(Value::from),
        1 => json_value(),
    ];
    let id = prop::option::of(prop_oneof![
        "[a-z0-9-]{1,12}".prop_map(Value::from),
        (120usize..140).prop_map(|n| Value::from("e".repeat(n))),
        json_value(),
    ]);
    let single = prop::option::weighted(0.1, body(&["policy", "subject", "cost"]));
    (requests, id, single).prop_map(|(requests, id, single)| {
        let mut o = match single.map(|b| serde_json::from_slice::<Value>(&b)) {
            Some(Ok(Value::Object(o))) => o,
            _ => serde_json::Map::new(),
        };
        o.insert("requests".into(), requests);
        if let Some(id) = id {
            o.insert("evaluation_id".into(), id);
        }
        Value::Object(o).to_string().into_bytes()
    })
}

/// Bytes that are often almost JSON.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..200).prop_map(|bytes| {
        const JSON_BYTES: &[u8] = b"{}[]\":,\\u0d8-1e9. keypolicysubjectcostid";
        bytes
            .iter()
            .map(|&b| JSON_BYTES.get(usize::from(b % 64)).copied().unwrap_or(b))
            .collect()
    })
}

const EVALUATE: &str = "/v1/evaluate";
const SUBMIT: &str = "/v1/gates/orders/events";

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn evaluate_bodies_never_panic_or_fail(bytes in prop_oneof![
        body(&["policy", "subject", "cost"]),
        jsonish(),
        prop::collection::vec(any::<u8>(), 0..300),
    ]) {
        let status = post(EVALUATE, bytes)?;
        prop_assert!([StatusCode::OK, StatusCode::BAD_REQUEST].contains(&status), "{}", status);
    }

    #[test]
    fn evaluate_list_bodies_never_panic_or_fail(bytes in prop_oneof![
        4 => list_body(),
        1 => body(&["requests", "evaluation_id", "policy", "subject"]),
    ]) {
        let status = post(EVALUATE, bytes)?;
        prop_assert!(
            [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_REQUEST].contains(&status),
            "{}",
            status
        );
    }

    #[test]
    fn gate_submit_bodies_never_panic_or_fail(bytes in prop_oneof![
        body(&["key", "id"]),
        jsonish(),
        prop::collection::vec(any::<u8>(), 0..300),
    ]) {
        let status = post(SUBMIT, bytes)?;
        prop_assert!(
            [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::CONFLICT, StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY]
                .contains(&status),
            "{}",
            status
        );
    }
}
