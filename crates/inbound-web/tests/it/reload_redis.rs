//! Configuration reload on the real binary over Redis (its own `redis-server`): event gates
//! may be added and removed by a reload while a gate that stays keeps its events and cannot
//! change its settings; policies reload over the same connections; a password changed in the
//! URL is refused by key path (the connections keep theirs) and never shown.

use crate::common;

use std::time::Duration;

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use common::App;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(10);
const EVERY: Duration = Duration::from_millis(50);

fn config(url: &str, gates: &str) -> String {
    let rate_limit = common::redis_rate_limit(url, "fail_closed", "");
    format!(
        r#"{rate_limit}
[reload]
watch = false

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 10
window = "1h"

[event_gates.orders]
mode = "only_once"
duration = "1h"
{gates}"#
    )
}

async fn submit(client: &reqwest::Client, app: &App, gate: &str, body: Value) -> (u16, Value) {
    let r = client
        .post(app.url(&format!("/v1/gates/{gate}/events")))
        .json(&body)
        .send()
        .await
        .expect("POST events");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn config_view(client: &reqwest::Client, app: &App) -> Value {
    let r = client.get(app.url("/v1/config")).send().await.expect("GET");
    r.json().await.expect("JSON")
}

/// Rewrites the file, sends SIGHUP and waits for `check` to hold on `/v1/config`.
async fn reload(
    client: &reqwest::Client,
    app: &App,
    text: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    std::fs::write(app.config_path(), text).expect("rewrite the configuration");
    app.signal("HUP");
    eventually(what, WITHIN, EVERY, async || {
        let c = config_view(client, app).await;
        if check(&c) { Ok(c) } else { Err(c) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_come_and_go_by_reload_and_a_kept_gate_keeps_its_events() {
    let server = RedisServer::start();
    let first = config(server.url(), "");
    let app = App::start(&first, &[]);
    let client = reqwest::Client::new();
    let (code, body) = submit(&client, &app, "orders", json!({"key": "k", "id": "o1"})).await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(
        submit(&client, &app, "signups", json!({"key": "k"}))
            .await
            .0,
        404
    );

    let added = config(
        server.url(),
        "\n[event_gates.signups]\nmode = \"only_once\"\nduration = \"1h\"\n",
    );
    reload(&client, &app, &added, "generation 2", |c| {
        c["generation"] == 2
    })
    .await;
    let (code, body) = submit(&client, &app, "signups", json!({"key": "k", "id": "s1"})).await;
    assert_eq!(code, 202, "the added gate: {body}");
    // orders kept its events: the same key within its duration conflicts with o1.
    let (code, body) = submit(&client, &app, "orders", json!({"key": "k", "id": "o2"})).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["conflicts_with"], "o1");

    // A kept gate cannot change its settings: refused by key path, nothing changes.
    let changed = added.replacen("duration = \"1h\"", "duration = \"2h\"", 1);
    let c = reload(&client, &app, &changed, "a refused reload", |c| {
        !c["last_refused_reload"].is_null()
    })
    .await;
    assert_eq!(c["generation"], 2, "{c}");
    let problems = c["last_refused_reload"]["problems"].to_string();
    assert!(
        problems.contains("event_gates.orders.duration"),
        "{problems}"
    );
    assert_eq!(
        submit(&client, &app, "signups", json!({"key": "k2"}))
            .await
            .0,
        202
    );

    // Removed: signups answers 404, orders still works.
    reload(&client, &app, &first, "generation 3", |c| {
        c["generation"] == 3
    })
    .await;
    assert_eq!(
        submit(&client, &app, "signups", json!({"key": "k3"}))
            .await
            .0,
        404
    );
    assert_eq!(
        submit(&client, &app, "orders", json!({"key": "other", "id": "o3"}))
            .await
            .0,
        202
    );
    let r = client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    assert_eq!(r.status().as_u16(), 200);
    let r = client
        .post(app.url("/v1/evaluate"))
        .json(&json!({"policy": "api", "subject": "s"}))
        .send()
        .await
        .expect("evaluate");
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_in_the_url_is_refused_by_key_path_and_never_shown() {
    const OLD: &str = "old-pass-1f9c";
    const NEW: &str = "new-pass-7a2e";
    let server = RedisServer::start();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("limiter")
        .arg("reset")
        .arg("on")
        .arg(format!(">{OLD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    let _: () = cmd.query(&mut server.connection()).expect("ACL SETUSER");
    let url = |password: &str| format!("redis://limiter:{password}@127.0.0.1:{}/0", server.port());
    let app = App::start(&config(&url(OLD), ""), &[]);
    let client = reqwest::Client::new();
    let evaluate = async || {
        client
            .post(app.url("/v1/evaluate"))
            .json(&json!({"policy": "api", "subject": "s"}))
            .send()
            .await
            .expect("evaluate")
            .status()
            .as_u16()
    };
    assert_eq!(evaluate().await, 200);

    // Only the password in the URL changes: a reload cannot apply it (the connections keep
    // the one they logged in with), so it is refused by key path, not reported as reloaded.
    let c = reload(
        &client,
        &app,
        &config(&url(NEW), ""),
        "a refused reload",
        |c| !c["last_refused_reload"].is_null(),
    )
    .await;
    assert_eq!(c["generation"], 1, "{c}");
    let problems = c["last_refused_reload"]["problems"].to_string();
    assert!(problems.contains("rate_limit.redis.url"), "{problems}");
    assert!(problems.contains("credentials"), "{problems}");
    let log = app.log();
    assert!(log.contains("rate_limit.redis.url"), "{log}");
    for shown in [c.to_string(), log] {
        assert!(
            !shown.contains(OLD) && !shown.contains(NEW),
            "a password shown: {shown}"
        );
    }
    assert_eq!(evaluate().await, 200);
}
