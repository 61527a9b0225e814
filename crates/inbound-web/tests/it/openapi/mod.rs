//! `GET /openapi.json` against the real app: the document is OpenAPI 3.1; the paths it names
//! are exactly the routes of the router (read from this crate's `.route(...)` calls, and
//! probed on the served app: documented operations answer, other methods are 405, other paths
//! 404); and real requests (allowed, denied, bad input, oversize, unknown gate, provider
//! failures, disabled mode, the stream) answer a status documented for their operation, with
//! a body that validates against the documented schema.

mod reservations;
mod schema;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use app_bootstrap::{RateLimitSettings, SubjectHasher, SubjectSecret};
use futures::StreamExt as _;
use inbound_web::gates::GateApi;
use inbound_web::state::ApiState;
use serde_json::Value;
use shared_contract::testing::ScriptedPort;
use shared_contract::{FailurePolicy, Readiness, UnavailableCategory};

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 3
window = "1h"
max_cost = 3

[rate_limit.policies.tight]
algorithm = "fixed_window"
limit = 1
window = "1h"

[rate_limit.policies.open]
algorithm = "fixed_window"
limit = 1
window = "1h"
failure_policy = "fail_open"

[rate_limit.policies.trial]
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true

[rate_limit.policies.jobs]
algorithm = "concurrency"
limit = 1
lease_ttl = "1h"

[[routes]]
path_prefix = "/api"
policy = "tight"
subject = "header:x-user"

[event_gates.orders]
mode = "only_once"
duration = "1h"
"#;

const DISABLED: &str = r#"
[[routes]]
path_prefix = "/api"
subject = "header:x-user"
"#;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn document() -> Value {
    serde_json::from_str(inbound_web::openapi::DOCUMENT).expect("openapi.json is JSON")
}

/// Every `(path, operation)` of the document, the fallback (`x-fallback`) left out.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        if item.get("x-fallback") == Some(&Value::Bool(true)) {
            continue;
        }
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((path.clone(), m.to_owned()));
            }
        }
    }
    out
}

/// Every `.route("PATH", ...)` in this crate's sources, with the methods its handler serves.
fn routed() -> BTreeSet<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeSet::new();
    // Every source file, in the module directories too (`gates/`).
    let mut files = Vec::new();
    let mut dirs = vec![dir];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(&dir)
            .expect("src")
            .flatten()
            .map(|e| e.path())
        {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for (at, _) in text.match_indices(".route(") {
            let rest = text[at + ".route(".len()..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let Some(end) = rest.find('"') else { continue };
            let path = &rest[..end];
            let call = call_text(&rest[end + 1..]);
            let mut methods: Vec<&str> = METHODS.into_iter().filter(|m| calls(call, m)).collect();
            if calls(call, "any") {
                methods = METHODS.to_vec();
            }
            assert!(
                !methods.is_empty(),
                "{}: no method for {path}",
                file.display()
            );
            for m in methods {
                out.insert((path.to_owned(), m.to_owned()));
            }
        }
    }
    out
}

/// The text of a call's arguments up to its closing parenthesis (one is already open).
fn call_text(s: &str) -> &str {
    let (mut depth, mut in_str, mut escaped) = (1usize, false, false);
    for (i, c) in s.char_indices() {
        match (in_str, c) {
            (true, '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (true, '"') if !escaped => in_str = false,
            (false, '"') => in_str = true,
            (false, '(') => depth += 1,
            (false, ')') => {
                depth -= 1;
                if depth == 0 {
                    return &s[..i];
                }
            }
            _ => {}
        }
        escaped = false;
    }
    s
}

/// Whether `text` calls the function `name` (a whole word followed by `(`).
fn calls(text: &str, name: &str) -> bool {
    text.match_indices(&format!("{name}(")).any(|(i, _)| {
        !text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn the_document_is_openapi_3_1_and_every_reference_resolves() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("openapi is a string");
    assert!(version.starts_with("3.1"), "openapi = {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    fn walk(root: &Value, v: &Value, refs: &mut usize) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    schema::resolve(root, r);
                    *refs += 1;
                }
                o.values().for_each(|v| walk(root, v, refs));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(root, v, refs)),
            _ => {}
        }
    }
    let mut refs = 0;
    walk(&doc, &doc, &mut refs);
    assert!(refs > 50, "{refs} references");
    let mut ids = BTreeSet::new();
    for item in doc["paths"].as_object().expect("paths").values() {
        for m in METHODS {
            if let Some(op) = item.get(m) {
                let id = op["operationId"].as_str().expect("an operationId");
                assert!(ids.insert(id.to_owned()), "operationId {id} twice");
                assert!(!op["responses"].as_object().expect("responses").is_empty());
            }
        }
    }
}

#[test]
fn the_document_names_exactly_the_routes_of_the_router() {
    let routed = routed();
    let documented = documented(&document());
    assert!(routed.len() >= 9, "found only {routed:?}");
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "routed but not in openapi.json: {undocumented:?}; documented but not routed: {unrouted:?}"
    );
    assert!(routed.contains(&("/openapi.json".to_owned(), "get".to_owned())));
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Local,
    Failing,
    Disabled,
}

/// The app served in process on a free loopback port (the real listener, body limit and
/// hygiene layer); stops when dropped.
struct Served {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(kind: Kind) -> Served {
    let config = if kind == Kind::Disabled {
        DISABLED
    } else {
        CONFIG
    };
    let settings = app_bootstrap::config::from_toml(config).expect("valid");
    let limiter = match (&settings.rate_limit, kind) {
        (_, Kind::Disabled) => None,
        (RateLimitSettings::Enabled(e), Kind::Failing) => Some(
            inbound_web::Limiter::new(
                // Never decides (connect failure), for the failure answers.
                Arc::new(
                    ScriptedPort::unavailable(
                        e.policies.clone(),
                        UnavailableCategory::Connect,
                        1000,
                    )
                    .with_readiness(Readiness::NotReady("redis: connection refused".to_owned())),
                ),
                SubjectHasher::new(&SubjectSecret::random()),
                FailurePolicy::FailClosed,
                Duration::from_secs(1),
            )
            // The app's providers are local and redis; this one stands for a Redis that is down.
            .with_provider_name("redis"),
        ),
        _ => app_bootstrap::build(&settings.rate_limit)
            .await
            .expect("built")
            .map(app_bootstrap::RateLimitRuntime::into_limiter),
    };
    let gates = app_bootstrap::build_gates(&settings)
        .await
        .expect("built")
        .map(Arc::new);
    let view = inbound_web::config_view::ConfigView::new(&settings, None);
    let state = Arc::new(ApiState::new(limiter.map(Arc::new), None).with_config_view(view));
    let router =
        inbound_web::app::router_with_gates(state, &settings.routes, Arc::new(GateApi::new(gates)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = settings.http.clone();
    tokio::spawn(async move {
        let _ = inbound_web::app::serve(listener, router, &http, async move {
            let _ = stopped.await;
        })
        .await;
    });
    Served { addr, _stop: stop }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client")
}

/// The documented response of `template` / `method` for `status` (a `$ref` resolved), or a
/// failure naming what is documented.
fn documented_response<'a>(doc: &'a Value, template: &str, method: &str, status: u16) -> &'a Value {
    let op = &doc["paths"][template][method];
    assert!(op.is_object(), "{method} {template} is not documented");
    let r = &op["responses"][status.to_string()];
    assert!(
        r.is_object(),
        "{method} {template} answered {status}, documented: {:?}",
        op["responses"]
            .as_object()
            .map(|o| o.keys().collect::<Vec<_>>())
    );
    match r.get("$ref").and_then(Value::as_str) {
        Some(reference) => schema::resolve(doc, reference),
        None => r,
    }
}

/// Asserts that a response conforms to the document: a documented status, and a body of a
/// documented media type that validates against its schema.
fn conforms(
    doc: &Value,
    template: &str,
    method: &str,
    status: u16,
    content_type: &str,
    body: &str,
) {
    let what = format!("{method} {template} -> {status} ({content_type}) {body:.300}");
    let response = documented_response(doc, template, method, status);
    let Some(content) = response.get("content").and_then(Value::as_object) else {
        assert!(body.is_empty(), "{what}: no body is documented");
        return;
    };
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let schema = &content
        .get(media)
        .unwrap_or_else(|| panic!("{what}: media type {media} is not documented"))["schema"];
    let value = if media == "text/plain" {
        Value::String(body.to_owned())
    } else {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
    };
    let errors = schema::validate(doc, schema, &value);
    assert!(errors.is_empty(), "{what}: {errors:#?}");
}

/// One request of a scenario: what to send, the operation it is, the status it must get.
struct Case {
    method: &'static str,
    path: String,
    template: &'static str,
    body: Option<String>,
    headers: Vec<(&'static str, String)>,
    expect: u16,
}

fn case(method: &'static str, path: &str, template: &'static str, expect: u16) -> Case {
    Case {
        method,
        path: path.to_owned(),
        template,
        body: None,
        headers: Vec::new(),
        expect,
    }
}

impl Case {
    fn body(mut self, body: &str) -> Self {
        self.body = Some(body.to_owned());
        self
    }
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// Sends each case in order and checks its answer against the document; returns the bodies.
async fn run(served: &Served, cases: Vec<Case>) -> Vec<String> {
    let doc = document();
    let c = client();
    let mut bodies = Vec::new();
    for case in cases {
        let url = format!("http://{}{}", served.addr, case.path);
        let method =
            reqwest::Method::from_bytes(case.method.to_uppercase().as_bytes()).expect("a method");
        let mut r = c.request(method, &url);
        for (name, value) in &case.headers {
            r = r.header(*name, value);
        }
        if let Some(b) = &case.body {
            r = r.body(b.clone());
        }
        let response = r.send().await.expect("an answer");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response.text().await.expect("a body");
        assert_eq!(
            status, case.expect,
            "{} {}: {body:.300}",
            case.method, case.path
        );
        conforms(
            &doc,
            case.template,
            case.method,
            status,
            &content_type,
            &body,
        );
        bodies.push(body);
    }
    bodies
}

const EVALUATE: &str = "/v1/evaluate";
const UPSTREAM: &str = "/{upstream_path}";
const SUBMIT: &str = "/v1/gates/{gate}/events";
const EVENT: &str = "/v1/gates/{gate}/events/{id}";
const SNAPSHOT: &str = "/v1/gates/{gate}/snapshot";
const STREAM: &str = "/v1/gates/{gate}/stream";
const LEASES: &str = "/v1/leases";
const LEASE: &str = "/v1/leases/{lease_id}";

fn evaluate(body: &str, expect: u16) -> Case {
    case("post", EVALUATE, EVALUATE, expect).body(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_have_documented_statuses_and_bodies() {
    let app = serve(Kind::Local).await;
    let long = "s".repeat(300);
    let cases = vec![
        case("get", "/healthz", "/healthz", 200),
        case("get", "/readyz", "/readyz", 200),
        case("get", "/metrics", "/metrics", 200),
        case("get", "/openapi.json", "/openapi.json", 200),
        evaluate(r#"{"policy":"api","subject":"s-1","cost":2}"#, 200),
        evaluate(r#"{"subject":"s-1"}"#, 200),
        evaluate(r#"{"policy":"api","subject":"s-1"}"#, 429),
        evaluate(
            r#"{"policy":"api","subject":"s-2","evaluation_id":"ev-1"}"#,
            200,
        ),
        evaluate(
            r#"{"policy":"api","subject":"s-2","evaluation_id":"ev-1"}"#,
            200,
        ),
        evaluate(r#"{"policy":"#, 400),
        evaluate(r#"{"policy":"nope","subject":"s"}"#, 400),
        evaluate(r#"{"policy":"api","subject":"s","cost":0}"#, 400),
        evaluate(r#"{"policy":"api"}"#, 400),
        evaluate(&format!(r#"{{"subject":"{long}"}}"#), 400),
        evaluate(r#"{"subject":"s","evaluation_id":""}"#, 400),
        evaluate(
            r#"{"requests":[{"policy":"api","subject":"l-1"},{"policy":"tight","subject":"l-1"}],"evaluation_id":"ev-2"}"#,
            200,
        ),
        evaluate(
            r#"{"requests":[{"policy":"api","subject":"l-1"},{"policy":"tight","subject":"l-1"}]}"#,
            429,
        ),
        // The enforced limit denies: the shadow one is not evaluated.
        evaluate(
            r#"{"requests":[{"policy":"tight","subject":"l-1"},{"policy":"trial","subject":"l-1"}]}"#,
            429,
        ),
        evaluate(r#"{"requests":[],"subject":"x"}"#, 400),
        evaluate(r#"{"requests":[]}"#, 400),
        evaluate(
            r#"{"requests":[{"policy":"api","subject":"a"},{"policy":"api","subject":"a"}]}"#,
            400,
        ),
        evaluate(&"x".repeat(70_000), 413),
        case(
            "get",
            &format!("/healthz?q={}", "a".repeat(9_000)),
            "/healthz",
            414,
        ),
        case("get", "/readyz", "/readyz", 431).header("x-big", &"b".repeat(33 * 1024)),
        case("post", "/v1/gates/orders/events", SUBMIT, 202).body(r#"{"key":"taco","id":"e-1"}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 202).body(r#"{"key":"other"}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 409).body(r#"{"key":"taco","id":"e-2"}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 200).body(r#"{"key":"taco","id":"e-1"}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 409).body(r#"{"key":"salsa","id":"e-1"}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 400).body(r#"{"key":"taco","x":1}"#),
        case("post", "/v1/gates/orders/events", SUBMIT, 400).body(r#"{"key":""}"#),
        case("post", "/v1/gates/nope/events", SUBMIT, 404).body(r#"{"key":"taco"}"#),
        case("get", "/v1/gates/orders/events/e-1", EVENT, 200),
        case("get", "/v1/gates/orders/events/e-none", EVENT, 404),
        case("get", "/v1/gates/nope/events/e-1", EVENT, 404),
        case("get", "/v1/gates/orders/snapshot", SNAPSHOT, 200),
        case("get", "/v1/gates/nope/snapshot", SNAPSHOT, 404),
        case("get", "/v1/gates/orders/stream", STREAM, 426),
        case("get", "/api/x", UPSTREAM, 200).header("x-user", "u-1"),
        case("post", "/api/x/y", UPSTREAM, 429).header("x-user", "u-1"),
        case("delete", "/api", UPSTREAM, 400).header("x-user", &long),
        case("put", "/nowhere", UPSTREAM, 404),
        case("patch", "/apix", UPSTREAM, 404),
        case("get", "/v1/config", "/v1/config", 200),
    ];
    let bodies = run(&app, cases).await;
    assert_eq!(bodies[3], inbound_web::openapi::DOCUMENT);
    assert!(bodies[8].contains(r#""replayed":true"#), "{}", bodies[8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_disabled_mode_answer_as_documented() {
    let failing = serve(Kind::Failing).await;
    run(
        &failing,
        vec![
            evaluate(r#"{"policy":"api","subject":"s"}"#, 503),
            evaluate(r#"{"policy":"open","subject":"s"}"#, 200),
            evaluate(r#"{"requests":[{"policy":"api","subject":"s"}]}"#, 503),
            case("get", "/readyz", "/readyz", 503),
            case("get", "/api/x", UPSTREAM, 503).header("x-user", "u"),
        ],
    )
    .await;
    let disabled = serve(Kind::Disabled).await;
    run(
        &disabled,
        vec![
            evaluate(r#"{"policy":"api","subject":"s"}"#, 503),
            case("get", "/readyz", "/readyz", 200),
            case("get", "/api/x", UPSTREAM, 200),
            case("get", "/v1/gates/orders/snapshot", SNAPSHOT, 404),
            case("post", "/v1/gates/orders/events", SUBMIT, 404).body(r#"{"key":"k"}"#),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_answers_are_documented() {
    let app = serve(Kind::Local).await;
    let acquire = |body: &str, expect| case("post", LEASES, LEASES, expect).body(body);
    let bodies = run(
        &app,
        vec![
            acquire(r#"{"policy":"jobs","subject":"j-1"}"#, 201),
            acquire(r#"{"policy":"jobs","subject":"j-1"}"#, 429),
            acquire(r#"{"policy":"api","subject":"j-1"}"#, 400),
            acquire(r#"{"policy":"nope","subject":"j-1"}"#, 400),
            acquire(r#"{"subject":"j-1"}"#, 400),
            acquire(r#"{"policy":"jobs"}"#, 400),
            acquire(r#"{"policy":"#, 400),
            evaluate(r#"{"policy":"jobs","subject":"j-1"}"#, 400),
        ],
    )
    .await;
    let lease: Value = serde_json::from_str(&bodies[0]).expect("JSON");
    let id = lease["lease_id"].as_str().expect("a lease id").to_owned();
    let path = format!("/v1/leases/{id}");
    let not_held = format!("/v1/leases/l1.jobs.{}.{}", "ab".repeat(32), "0".repeat(32));
    let release = |path: &str, expect| case("delete", path, LEASE, expect);
    run(
        &app,
        vec![
            release(&format!("{path}?subject=j-2"), 403),
            release(&format!("{path}?subject=j-1"), 200),
            release(&path, 404),
            release(&not_held, 404),
            release("/v1/leases/l2.jobs.x.y", 400),
            release(&path.replace("jobs", "api"), 400),
            acquire(r#"{"policy":"jobs","subject":"j-1"}"#, 201),
        ],
    )
    .await;
}

/// The path of `template` with each parameter filled in.
fn concrete(template: &str) -> String {
    template
        .replace("{gate}", "orders")
        .replace("{id}", "e-probe")
        .replace("{lease_id}", "l-probe")
        .replace("{reservation_id}", "r-probe")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served_and_no_other() {
    let app = serve(Kind::Local).await;
    let doc = document();
    let c = client();
    let send = |method: &str, path: &str| {
        let url = format!("http://{}{path}", app.addr);
        let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        let r = c.request(m, url).body("{}");
        async move {
            let r = r.send().await.expect("an answer");
            let status = r.status().as_u16();
            let allow = r.headers().contains_key("allow");
            let body: Value =
                serde_json::from_str(&r.text().await.expect("a body")).unwrap_or(Value::Null);
            (status, allow, body)
        }
    };
    let operations = documented(&doc);
    for path in operations.iter().map(|(p, _)| p).collect::<BTreeSet<_>>() {
        for m in METHODS {
            let (status, allow, body) = send(m, &concrete(path)).await;
            if operations.contains(&(path.clone(), m.to_owned())) {
                let router_404 = status == 404 && body["error"] == "not_found";
                assert!(
                    status != 405 && !router_404,
                    "{m} {path} is documented but answers {status} {body}"
                );
            } else {
                assert_eq!(status, 405, "{m} {path} is not documented: {body}");
                assert!(allow && body["error"] == "method_not_allowed", "{body}");
            }
        }
    }
    for path in [
        "/",
        "/v1",
        "/v1/evaluate/x",
        "/v1/gates/orders",
        "/v2/evaluate",
        "/openapi.yaml",
    ] {
        for m in METHODS {
            let (status, _, body) = send(m, path).await;
            assert_eq!(
                (status, &body["error"]),
                (404, &Value::from("not_found")),
                "{m} {path}"
            );
            conforms(
                &doc,
                UPSTREAM,
                m,
                status,
                "application/problem+json",
                &body.to_string(),
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_upgrades_and_its_frames_are_documented() {
    let app = serve(Kind::Local).await;
    let doc = document();
    run(
        &app,
        vec![
            case("post", "/v1/gates/orders/events", SUBMIT, 202).body(r#"{"key":"k","id":"s-1"}"#),
        ],
    )
    .await;
    let url = format!("ws://{}/v1/gates/orders/stream", app.addr);
    let (mut socket, response) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .expect("in time")
    .expect("upgraded");
    let status = response.status().as_u16();
    conforms(&doc, STREAM, "get", status, "", "");
    let frame_schema = &documented_response(&doc, STREAM, "get", 101)["x-websocket-frame"];
    let frame = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("a frame in time")
        .expect("a frame")
        .expect("no error");
    let text = frame.into_text().expect("a text frame");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(value["type"], "snapshot", "{value}");
    assert_eq!(value["incubating"][0]["id"], "s-1", "{value}");
    let errors = schema::validate(&doc, frame_schema, &value);
    assert!(errors.is_empty(), "{text}: {errors:#?}");
    let status_frame = serde_json::json!({"type":"status","id":"s-1","key":"k",
        "status":"published","clock":9,"at_ms":1,"publish_at_ms":1});
    assert!(schema::validate(&doc, frame_schema, &status_frame).is_empty());
}

/// Every `category` the document enumerates is one of the contract's category lists, and
/// both lists are there: a category added to the contract must be added to the document.
#[test]
fn the_documented_categories_are_the_contracts() {
    use shared_contract::{IncompatibleCategory, UnavailableCategory};
    fn enums(v: &Value, out: &mut Vec<BTreeSet<String>>) {
        match v {
            Value::Object(o) => {
                if let Some(list) = o.get("category").and_then(|c| c["enum"].as_array()) {
                    out.push(
                        list.iter()
                            .filter_map(|s| s.as_str().map(str::to_owned))
                            .collect(),
                    );
                }
                o.values().for_each(|v| enums(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| enums(v, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    enums(&document(), &mut found);
    let unavailable: BTreeSet<String> = UnavailableCategory::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    let incompatible: BTreeSet<String> = IncompatibleCategory::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    for list in &found {
        assert!(
            *list == unavailable || *list == incompatible,
            "{list:?} is neither {unavailable:?} nor {incompatible:?}"
        );
    }
    assert!(found.contains(&unavailable), "{found:?}");
    assert!(found.contains(&incompatible), "{found:?}");
}
