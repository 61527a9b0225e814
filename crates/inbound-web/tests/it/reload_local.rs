//! Configuration reload on the real binary over the local provider: a valid file goes into
//! force whole (on a file change and on SIGHUP), an invalid, truncated, missing or
//! revision-breaking one changes nothing and says why by key path (log, metric,
//! `/v1/config`), a refused change written back to the bytes in force clears the refused
//! reload, an unchanged policy keeps its state, and a request in flight finishes on the
//! configuration it started with while its connection is kept.

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use acceptance_tests::eventually::eventually;
use common::App;
use serde_json::Value;

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 3
window = "1h"
revision = 1

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 2
window = "1h"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-user"
"#;

const WITHIN: Duration = Duration::from_secs(10);
const EVERY: Duration = Duration::from_millis(50);

async fn config(client: &reqwest::Client, app: &App) -> Value {
    let r = client
        .get(app.url("/v1/config"))
        .send()
        .await
        .expect("GET /v1/config");
    assert_eq!(r.status(), 200);
    r.json().await.expect("a JSON body")
}

/// Waits until `/v1/config` shows `generation`.
async fn generation(client: &reqwest::Client, app: &App, want: u64) -> Value {
    eventually(
        &format!("generation {want} in force"),
        WITHIN,
        EVERY,
        async || {
            let c = config(client, app).await;
            if c["generation"] == want {
                Ok(c)
            } else {
                Err(c)
            }
        },
    )
    .await
}

/// Waits until `/v1/config` reports a refused reload whose problems mention `needle`.
async fn refused(client: &reqwest::Client, app: &App, needle: &str) -> Value {
    eventually(
        &format!("a refused reload naming {needle}"),
        WITHIN,
        EVERY,
        async || {
            let c = config(client, app).await;
            let named = c["last_refused_reload"]["problems"]
                .as_array()
                .is_some_and(|ps| {
                    ps.iter()
                        .any(|p| p.as_str().is_some_and(|p| p.contains(needle)))
                });
            if named { Ok(c) } else { Err(c) }
        },
    )
    .await
}

async fn route(client: &reqwest::Client, app: &App, path: &str, user: &str) -> u16 {
    client
        .get(app.url(path))
        .header("x-user", user)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

async fn evaluate(client: &reqwest::Client, app: &App, policy: &str, subject: &str) -> Value {
    let r = client
        .post(app.url("/v1/evaluate"))
        .json(&serde_json::json!({"policy": policy, "subject": subject}))
        .send()
        .await
        .expect("evaluate");
    r.json().await.expect("a decision")
}

fn write(app: &App, text: &str) {
    // Written whole in one call: the watcher debounces a file that is still changing anyway.
    std::fs::write(app.config_path(), text).expect("rewrite the configuration");
}

#[tokio::test]
async fn a_valid_change_goes_into_force_and_unchanged_policies_keep_their_state() {
    let app = App::start(CONFIG, &[]);
    let client = reqwest::Client::new();
    let first = config(&client, &app).await;
    assert_eq!(first["generation"], 1);
    assert!(
        first["loaded_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{first}"
    );
    assert_eq!(first["config"]["rate_limit"]["policies"]["api"]["limit"], 3);
    assert!(first["last_refused_reload"].is_null());

    assert_eq!(route(&client, &app, "/api/x", "u1").await, 200);
    assert_eq!(
        evaluate(&client, &app, "tenant", "t1").await["remaining"],
        1
    );

    // tenant changes (new revision: fresh state); api does not (its state is kept); a new
    // route is added.
    let next = CONFIG.replace(
        "limit = 2\nwindow = \"1h\"",
        "limit = 10\nwindow = \"1h\"\nrevision = 2",
    ) + "\n[[routes]]\npath_prefix = \"/other\"\npolicy = \"tenant\"\nsubject = \"header:x-user\"\n";
    write(&app, &next);
    let second = generation(&client, &app, 2).await;
    assert_eq!(
        second["config"]["rate_limit"]["policies"]["tenant"]["limit"],
        10
    );
    assert!(second["loaded_at"].as_str() > first["loaded_at"].as_str());

    assert_eq!(route(&client, &app, "/api/x", "u1").await, 200);
    assert_eq!(route(&client, &app, "/api/x", "u1").await, 200);
    assert_eq!(
        route(&client, &app, "/api/x", "u1").await,
        429,
        "api kept the charge made before the reload (3 in the hour)"
    );
    let t = evaluate(&client, &app, "tenant", "t1").await;
    assert_eq!(
        (t["limit"].as_u64(), t["remaining"].as_u64()),
        (Some(10), Some(9)),
        "{t}"
    );
    assert_eq!(
        route(&client, &app, "/other/x", "u1").await,
        200,
        "the new route"
    );
    let metrics = common::metrics(&client, &app).await;
    assert!(
        metrics.contains("config_reloads_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("config_generation 2"), "{metrics}");
    assert!(
        app.log().contains("configuration reloaded"),
        "{}",
        app.log()
    );
}

#[tokio::test]
async fn invalid_truncated_missing_and_unbumped_files_change_nothing() {
    let app = App::start(CONFIG, &[]);
    let client = reqwest::Client::new();
    assert_eq!(evaluate(&client, &app, "api", "s").await["remaining"], 2);

    // An invalid value, named by key path.
    write(&app, &CONFIG.replace("limit = 3", "limit = -3"));
    refused(&client, &app, "rate_limit.policies.api.limit").await;

    // Half-written: the file cut inside a table.
    let cut = CONFIG[..CONFIG.rfind("subject").expect("a subject") + 12].to_owned();
    write(&app, &cut);
    refused(&client, &app, "--config").await;

    // Changed without a revision bump.
    write(&app, &CONFIG.replace("limit = 3", "limit = 30"));
    refused(&client, &app, "rate_limit.policies.api.revision").await;

    // A setting that needs a restart.
    write(&app, &format!("[http]\nmax_connections = 7\n{CONFIG}"));
    refused(&client, &app, "http.max_connections").await;

    // Gone.
    std::fs::remove_file(app.config_path()).expect("remove the configuration");
    let gone = refused(&client, &app, "--config").await;

    assert_eq!(gone["generation"], 1, "{gone}");
    assert_eq!(gone["config"]["rate_limit"]["policies"]["api"]["limit"], 3);
    let d = evaluate(&client, &app, "api", "s").await;
    assert_eq!(
        (d["limit"].as_u64(), d["remaining"].as_u64()),
        (Some(3), Some(1)),
        "{d}"
    );
    let metrics = common::metrics(&client, &app).await;
    assert!(
        metrics.contains("config_reloads_total{outcome=\"applied\"} 0"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("config_reloads_total{outcome=\"refused\"} 0"),
        "{metrics}"
    );
    let log = app.log();
    assert!(log.contains("rate_limit.policies.api.revision"), "{log}");
    assert!(log.contains("configuration in force is unchanged"), "{log}");

    // And a good file after all that is taken.
    write(
        &app,
        &CONFIG
            .replace("limit = 3\nwindow", "limit = 4\nwindow")
            .replace("revision = 1", "revision = 2"),
    );
    let c = generation(&client, &app, 2).await;
    assert!(c["last_refused_reload"].is_null(), "{c}");
}

#[tokio::test]
async fn a_refused_change_written_back_to_the_bytes_in_force_clears_the_refused_reload() {
    let app = App::start(CONFIG, &[]);
    let client = reqwest::Client::new();
    let in_force = std::fs::read(app.config_path()).expect("the configuration in force");
    write(&app, &CONFIG.replace("limit = 3", "limit = 30"));
    refused(&client, &app, "rate_limit.policies.api.revision").await;

    std::fs::write(app.config_path(), &in_force).expect("write back the bytes in force");
    let c = eventually("the refused reload cleared", WITHIN, EVERY, async || {
        let c = config(&client, &app).await;
        if c["last_refused_reload"].is_null() {
            Ok(c)
        } else {
            Err(c)
        }
    })
    .await;
    // Nothing was reloaded: the file is what is in force.
    assert_eq!(c["generation"], 1, "{c}");
    assert_eq!(c["config"]["rate_limit"]["policies"]["api"]["limit"], 3);
    let log = app.log();
    assert!(log.contains("back to the configuration in force"), "{log}");
}

#[tokio::test]
async fn sighup_reloads_when_watching_is_off() {
    let off = format!("[reload]\nwatch = false\n{CONFIG}");
    let app = App::start(&off, &[]);
    let client = reqwest::Client::new();
    write(
        &app,
        &off.replace("limit = 3", "limit = 5")
            .replace("revision = 1", "revision = 2"),
    );
    // Longer than a poll and its debounce: a watcher would have reloaded by now.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(config(&client, &app).await["generation"], 1);
    app.signal("HUP");
    let c = generation(&client, &app, 2).await;
    assert_eq!(c["config"]["rate_limit"]["policies"]["api"]["limit"], 5);
    assert_eq!(evaluate(&client, &app, "api", "s").await["limit"], 5);
    assert!(app.log().contains("trigger=\"SIGHUP\""), "{}", app.log());
}

/// Reads one HTTP/1.1 response (head and a Content-Length body) from `stream`.
fn read_response(stream: &mut TcpStream) -> (u16, Value) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("read the head");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).expect("a UTF-8 head");
    let status = head[9..12].parse().expect("a status");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .expect("a content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("read the body");
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}

#[tokio::test]
async fn a_request_in_flight_finishes_on_its_configuration_and_the_connection_is_kept() {
    let off = format!("[reload]\nwatch = false\n{CONFIG}");
    let app = App::start(&off, &[]);
    let client = reqwest::Client::new();
    let body = r#"{"policy":"api","subject":"inflight"}"#;
    let mut stream = TcpStream::connect(&app.addr).expect("connect");
    stream.set_read_timeout(Some(WITHIN)).expect("timeout");
    let head = format!(
        "POST /v1/evaluate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send the head");
    stream
        .write_all(&body.as_bytes()[..10])
        .expect("send half the body");
    // The request has started; now the configuration changes under it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    write(
        &app,
        &off.replace("limit = 3", "limit = 7")
            .replace("revision = 1", "revision = 2"),
    );
    app.signal("HUP");
    generation(&client, &app, 2).await;
    stream
        .write_all(&body.as_bytes()[10..])
        .expect("send the rest");
    let (status, old) = read_response(&mut stream);
    assert_eq!(status, 200);
    assert_eq!(
        (old["limit"].as_u64(), old["revision"].as_u64()),
        (Some(3), Some(1)),
        "{old}"
    );

    // The same connection, a new request: the new configuration.
    let again = format!("{head}{body}");
    stream
        .write_all(again.as_bytes())
        .expect("send on the kept connection");
    let (status, new) = read_response(&mut stream);
    assert_eq!(status, 200);
    assert_eq!(
        (new["limit"].as_u64(), new["revision"].as_u64()),
        (Some(7), Some(2)),
        "{new}"
    );
}

#[tokio::test]
async fn local_gates_come_and_go_by_reload_and_a_kept_gate_keeps_its_events() {
    let gate = "\n[event_gates.orders]\nmode = \"only_once\"\nduration = \"1h\"\n";
    let off = format!("[reload]\nwatch = false\n{CONFIG}{gate}");
    let app = App::start(&off, &[]);
    let client = reqwest::Client::new();
    let submit = async |gate: &str, id: &str| {
        let r = client
            .post(app.url(&format!("/v1/gates/{gate}/events")))
            .json(&serde_json::json!({"key": "k", "id": id}))
            .send()
            .await
            .expect("submit");
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    assert_eq!(submit("orders", "o1").await.0, 202);
    assert_eq!(submit("signups", "s1").await.0, 404);

    let added = format!("{off}\n[event_gates.signups]\nmode = \"only_once\"\nduration = \"1h\"\n");
    write(&app, &added);
    app.signal("HUP");
    generation(&client, &app, 2).await;
    assert_eq!(submit("signups", "s1").await.0, 202, "the added gate");
    let (code, body) = submit("orders", "o2").await;
    assert_eq!(
        (code, &body["conflicts_with"]),
        (409, &Value::from("o1")),
        "{body}"
    );

    write(
        &app,
        &added.replacen("duration = \"1h\"", "duration = \"2h\"", 1),
    );
    app.signal("HUP");
    refused(&client, &app, "event_gates.orders.duration").await;

    write(&app, &off);
    app.signal("HUP");
    generation(&client, &app, 3).await;
    assert_eq!(submit("signups", "s2").await.0, 404, "the removed gate");
    assert_eq!(submit("orders", "o3").await.0, 409, "orders still holds o1");
}
