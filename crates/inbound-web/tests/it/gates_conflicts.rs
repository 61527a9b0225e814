//! End-to-end tests of what a gate must refuse or report rather than pass as success, on the
//! real binary: an event id reused with another key (409 problem+json, nothing changed; local
//! and Redis), and `/readyz` covering the gates (an ACL user without the gate commands, a
//! gate whose stored state has another duration than configured, which is also logged).

use crate::common;

use std::time::Duration;

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use common::App;
use serde_json::{Value, json};

const GATE: &str = r#"
[event_gates.orders]
mode = "strictly_once"
duration = "1m"
"#;

/// A password the tests give the ACL user.
const PASSWORD: &str = "gate-acl-test-pw-31";

/// The Redis rate limiter (one policy) at `url`, and `gates`.
fn redis_config(url: &str, gates: &str) -> String {
    let rate_limit = common::redis_rate_limit(url, "fail_closed", "");
    format!(
        "{rate_limit}\n[rate_limit.policies.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\n{gates}"
    )
}

async fn call(req: reqwest::RequestBuilder) -> (u16, String, Value) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, ct, r.json().await.expect("JSON body"))
}

async fn submit(client: &reqwest::Client, app: &App, body: Value) -> (u16, String, Value) {
    let req = client.post(app.url("/v1/gates/orders/events")).json(&body);
    call(req).await
}

async fn readyz(client: &reqwest::Client, app: &App) -> (u16, Value) {
    let (status, _, body) = call(client.get(app.url("/readyz"))).await;
    (status, body)
}

async fn id_reuse_is_refused(app: &App) {
    let client = reqwest::Client::new();
    let (code, _, first) = submit(&client, app, json!({"key": "alpha", "id": "dup-1"})).await;
    assert_eq!(code, 202, "{first}");
    let (code, ct, body) = submit(&client, app, json!({"key": "beta", "id": "dup-1"})).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(ct, "application/problem+json");
    assert_eq!(body["error"], "id_reused", "{body}");
    assert_eq!(
        (
            &body["id"],
            &body["key"],
            &body["held_key"],
            &body["held_status"]
        ),
        (
            &json!("dup-1"),
            &json!("beta"),
            &json!("alpha"),
            &json!("submitted")
        ),
        "{body}"
    );
    assert_eq!(body["status"], 409);
    // Nothing changed: the event is alpha's, and beta was never received (its first event is
    // submitted, not rejected as a conflict with dup-1).
    let req = client.get(app.url("/v1/gates/orders/events/dup-1"));
    let (code, _, held) = call(req).await;
    assert_eq!((code, &held["key"]), (200, &json!("alpha")), "{held}");
    assert_eq!(held["clock"], first["clock"]);
    let (code, _, beta) = submit(&client, app, json!({"key": "beta", "id": "b-1"})).await;
    assert_eq!(code, 202, "{beta}");
    // The same id with its own key is still a safe retry.
    let (code, _, retry) = submit(&client, app, json!({"key": "alpha", "id": "dup-1"})).await;
    assert_eq!((code, &retry["duplicate"]), (200, &json!(true)), "{retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_with_another_key_is_409_problem_json_on_the_local_provider() {
    let app = App::start(GATE, &[]);
    id_reuse_is_refused(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_with_another_key_is_409_problem_json_on_the_redis_provider() {
    let server = RedisServer::start();
    let app = App::start(&redis_config(server.url(), GATE), &[]);
    id_reuse_is_refused(&app).await;
}

/// The rules of the documented least-privilege user for rate limits only.
fn rate_limit_only_rules() -> Vec<String> {
    let doc = include_str!("../../../../docs/operations.md");
    doc.lines()
        .find_map(|l| l.strip_prefix("user limiter on >PASSWORD "))
        .expect("operations.md documents the rate-limit user")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_gates_whose_acl_user_lacks_their_commands() {
    let server = RedisServer::start();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("limiter")
        .arg("reset")
        .arg("on")
        .arg(format!(">{PASSWORD}"));
    for r in rate_limit_only_rules() {
        cmd.arg(r);
    }
    let _: () = cmd.query(&mut server.connection()).expect("ACL SETUSER");
    let url = format!("redis://limiter:{PASSWORD}@127.0.0.1:{}", server.port());
    let app = App::start(&redis_config(&url, GATE), &[]);
    let client = reqwest::Client::new();
    let body = eventually(
        "the rate limiter ready and the gates reported",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || match readyz(&client, &app).await {
            (503, b) if b["provider"] == "redis" && b["gates"]["status"] == "not_ready" => Ok(b),
            other => Err(other),
        },
    )
    .await;
    assert_eq!(body["status"], "not_ready", "{body}");
    assert_eq!(body["gates"]["provider"], "redis", "{body}");
    let reason = body["gates"]["reason"].as_str().expect("a reason");
    assert!(reason.contains("limiter"), "names the ACL user: {reason}");
    assert!(!reason.contains(PASSWORD), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_the_log_report_a_gate_whose_stored_duration_differs() {
    let server = RedisServer::start();
    let first = App::start(&redis_config(server.url(), GATE), &[]);
    let client = reqwest::Client::new();
    let (code, _, _) = submit(&client, &first, json!({"key": "k", "id": "e1"})).await;
    assert_eq!(code, 202);
    let (code, ready) = readyz(&client, &first).await;
    assert_eq!(
        (code, &ready["gates"]["status"]),
        (200, &json!("ready")),
        "{ready}"
    );
    drop(first);

    let other = GATE.replace("duration = \"1m\"", "duration = \"3s\"");
    let second = App::start(&redis_config(server.url(), &other), &[]);
    let want = "event gate orders: stored state has mode strictly_once and duration 60000 ms, \
                configured mode strictly_once and duration 3000 ms";
    // Logged at start-up, without any request.
    eventually(
        "the mismatch logged",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let log = second.log();
            if log.contains(want) { Ok(()) } else { Err(log) }
        },
    )
    .await;
    let (code, body) = readyz(&client, &second).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["gates"]["status"], "not_ready", "{body}");
    let reason = body["gates"]["reason"].as_str().expect("a reason");
    assert!(reason.starts_with(want), "{reason}");
    // Logged once, not per probe.
    let _ = readyz(&client, &second).await;
    assert_eq!(second.log().matches(want).count(), 1, "{}", second.log());
}
