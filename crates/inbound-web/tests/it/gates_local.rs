//! End-to-end tests of the event gates on the real binary with the local provider: the
//! worked examples of `docs/event-gates.md` through HTTP in both modes, the JSON and status
//! codes of every gate route, a WebSocket subscriber that rebuilds the gate from snapshot
//! plus deltas with `Replica`, and the STOMP 1.2 subprotocol of the stream.

use crate::common;

use std::time::{Duration, Instant};

use common::{App, Ws};
use serde_json::{Value, json};
use shared_contract::gate::{
    EventId, EventKey, EventStatus, GateClock, IncubatingEvent, Replica, Snapshot, StatusUpdate,
};

/// The worked examples' unit of time (1 in the document); their duration is 3 units.
const UNIT_MS: u64 = 200;

const GATES: &str = r#"
[event_gates.once]
mode = "only_once"
duration = "600ms"

[event_gates.strict]
mode = "strictly_once"
duration = "600ms"

[event_gates.slow]
mode = "only_once"
duration = "300ms"
retention = "1m"
max_events = 1000
max_clock_regression = "1s"
"#;

async fn submit(client: &reqwest::Client, app: &App, gate: &str, body: Value) -> (u16, Value) {
    let r = client
        .post(app.url(&format!("/v1/gates/{gate}/events")))
        .json(&body)
        .send()
        .await
        .expect("POST events");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

async fn get(client: &reqwest::Client, app: &App, path: &str) -> (u16, String, Value) {
    let r = client.get(app.url(path)).send().await.expect("GET");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let text = r.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, ct, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_examples_give_the_documented_answers_in_both_modes() {
    let mut app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut answers = Vec::new();
    for (at, key, id) in common::WORKED_EXAMPLE {
        let due = start + Duration::from_millis(at * UNIT_MS);
        tokio::time::sleep_until(due.into()).await;
        let once = submit(&client, &app, "once", json!({"key": key, "id": id})).await;
        let strict = submit(&client, &app, "strict", json!({"key": key, "id": id})).await;
        answers.push((id, once, strict));
    }
    let status = |v: &(u16, Value)| (v.0, v.1["status"].as_str().unwrap_or("").to_owned());
    let want_once = [
        (202, "submitted"),
        (202, "submitted"),
        (409, "rejected"),
        (409, "rejected"),
        (202, "submitted"),
    ];
    let want_strict = [
        (202, "submitted"),
        (202, "submitted"),
        (409, "rejected"),
        (409, "rejected"),
        (202, "submitted"),
    ];
    for (i, (id, once, strict)) in answers.iter().enumerate() {
        assert_eq!(
            status(once),
            (want_once[i].0, want_once[i].1.to_owned()),
            "{id} once"
        );
        assert_eq!(
            status(strict),
            (want_strict[i].0, want_strict[i].1.to_owned()),
            "{id} strict"
        );
        assert_eq!(once.1["id"], *id);
        assert!(once.1["clock"].as_u64().is_some_and(|c| c > 0));
    }
    // Rejections name the conflicting event: the last submitted one (only_once), the last
    // received one (strictly_once).
    assert_eq!(answers[2].1.1["conflicts_with"], "t2");
    assert_eq!(answers[3].1.1["conflicts_with"], "t2");
    assert_eq!(answers[2].2.1["conflicts_with"], "t2");
    assert_eq!(answers[3].2.1["conflicts_with"], "t3");
    // Clocks are unique and increasing across one gate.
    let clocks: Vec<u64> = answers
        .iter()
        .map(|a| a.1.1["clock"].as_u64().unwrap_or(0))
        .collect();
    assert!(clocks.windows(2).all(|w| w[0] < w[1]), "{clocks:?}");

    // Wait until the last event is published (8 + 3 units), plus margin.
    tokio::time::sleep_until((start + Duration::from_millis(11 * UNIT_MS + 400)).into()).await;
    let fate = |gate: &'static str, id: &'static str| {
        let client = client.clone();
        let path = format!("/v1/gates/{gate}/events/{id}");
        let app = &app;
        async move { get(&client, app, &path).await }
    };
    for (gate, id, want) in common::WORKED_EXAMPLE_FATES {
        let (code, _, body) = fate(gate, id).await;
        assert_eq!(code, 200, "{gate}/{id}: {body}");
        assert_eq!(body["status"], want, "{gate}/{id}: {body}");
        assert_eq!(body["id"], id);
        for k in ["key", "clock"] {
            assert!(body.get(k).is_some(), "{k} missing: {body}");
        }
    }
    // Rejected events never enter the lifecycle.
    let (code, ct, body) = fate("once", "t3").await;
    assert_eq!(
        (code, ct.as_str()),
        (404, "application/problem+json"),
        "{body}"
    );
    // Nothing incubates any more (published without any request in between).
    let (code, _, snap) = get(&client, &app, "/v1/gates/once/snapshot").await;
    assert_eq!(code, 200);
    assert_eq!(snap["incubating"], json!([]), "{snap}");
    assert!(snap["clock"].as_u64().is_some_and(|c| c >= clocks[4]));
    assert!(app.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_routes_answer_duplicates_unknown_gates_bad_input_and_server_ids() {
    let mut app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    let (code, first) = submit(&client, &app, "slow", json!({"key": "k", "id": "e-1"})).await;
    assert_eq!(code, 202, "{first}");
    let mut keys: Vec<&str> = first
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["clock", "id", "publish_at_ms", "status"]);
    // A retried submission is a duplicate: 200 with the event's current record, same clock.
    let (code, dup) = submit(&client, &app, "slow", json!({"key": "k", "id": "e-1"})).await;
    assert_eq!(code, 200, "{dup}");
    assert_eq!(dup["status"], "submitted");
    assert_eq!(dup["duplicate"], true);
    assert_eq!(dup["clock"], first["clock"]);
    // The snapshot lists it while it incubates.
    let (code, _, snap) = get(&client, &app, "/v1/gates/slow/snapshot").await;
    assert_eq!(code, 200);
    assert_eq!(snap["incubating"][0]["id"], "e-1");
    assert_eq!(snap["incubating"][0]["key"], "k");
    assert!(
        snap["incubating"][0]["publish_at_ms"].as_u64()
            > snap["incubating"][0]["submitted_at_ms"].as_u64()
    );
    // No id: the server makes one of 16 hex characters.
    let (code, made) = submit(&client, &app, "slow", json!({"key": "other"})).await;
    assert_eq!(code, 202, "{made}");
    let id = made["id"].as_str().expect("id");
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let (code, _, rec) = get(&client, &app, &format!("/v1/gates/slow/events/{id}")).await;
    assert_eq!((code, rec["key"].as_str()), (200, Some("other")));
    // Unknown gate: 404 problem+json on every route.
    let (code, unknown) = submit(&client, &app, "nope", json!({"key": "k"})).await;
    assert_eq!(code, 404, "{unknown}");
    assert_eq!(unknown["error"], "unknown_gate");
    for path in [
        "/v1/gates/nope/snapshot",
        "/v1/gates/nope/events/x",
        "/v1/gates/NOPE!/snapshot",
    ] {
        let (code, ct, _) = get(&client, &app, path).await;
        assert_eq!(
            (code, ct.as_str()),
            (404, "application/problem+json"),
            "{path}"
        );
    }
    // Bad input: 400 problem+json, nothing submitted.
    for body in [
        json!({}),
        json!({"key": ""}),
        json!({"key": "k", "id": "has space"}),
        json!({"key": "k", "extra": 1}),
    ] {
        let (code, p) = submit(&client, &app, "slow", body.clone()).await;
        assert_eq!(code, 400, "{body}: {p}");
    }
    let (_, _, after) = get(&client, &app, "/v1/gates/slow/snapshot").await;
    assert_eq!(
        after["incubating"].as_array().map(Vec::len),
        Some(2),
        "{after}"
    );
    assert!(app.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_event_that_is_an_array_is_malformed_body_and_submits_nothing() {
    let mut app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    // serde would read `["k","a-1"]` as key and id by position.
    for body in [json!(["k", "a-1"]), json!(["k"]), json!([])] {
        let (code, p) = submit(&client, &app, "slow", body.clone()).await;
        assert_eq!(code, 400, "{body}: {p}");
        assert_eq!(p["error"], "malformed_body", "{body}: {p}");
    }
    let (code, _, _) = get(&client, &app, "/v1/gates/slow/events/a-1").await;
    assert_eq!(code, 404, "the gate holds no event a-1");
    let (_, _, snap) = get(&client, &app, "/v1/gates/slow/snapshot").await;
    assert_eq!(
        snap["incubating"].as_array().map(Vec::len),
        Some(0),
        "{snap}"
    );
    let (code, first) = submit(&client, &app, "slow", json!({"key": "k", "id": "a-1"})).await;
    assert_eq!(code, 202, "a first submission, not a duplicate: {first}");
    assert!(app.terminate().success());
}

#[test]
fn no_gate_configured_means_every_gate_route_is_404_and_bad_gates_are_refused_by_key_path() {
    let app = App::start("", &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::new();
        let (code, body) = submit(&client, &app, "orders", json!({"key": "k"})).await;
        assert_eq!(code, 404, "{body}");
    });
    assert!(app.log().contains("listening"));
    let bad = r#"
[event_gates.orders]
mode = "exactly_once"
duration = "0s"
colour = "red"

[event_gates."Bad Id"]
mode = "only_once"
duration = "1s"
"#;
    let out = common::run(bad, &["--check"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for path in [
        "event_gates.orders.mode:",
        "event_gates.orders.colour:",
        "event_gates.Bad Id:",
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(path)),
            "{path} not in:\n{err}"
        );
    }
    let zero = "[event_gates.orders]\nmode = \"only_once\"\nduration = \"0s\"\n";
    let out = common::run(zero, &["--check"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("event_gates.orders.duration:"), "{err}");
    let ok = common::run(GATES, &["--check"], &[]);
    assert_eq!(ok.status.code(), Some(0));
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        text.contains("[event_gates.strict]\nmode = \"strictly_once\"\nduration = \"600ms\""),
        "{text}"
    );
}

/// The next frame, as JSON (fails after 5 s).
async fn next(ws: &mut Ws) -> Value {
    common::ws_json(ws).await
}

fn snapshot_of(v: &Value) -> Snapshot {
    let incubating = v["incubating"]
        .as_array()
        .expect("incubating")
        .iter()
        .map(|e| IncubatingEvent {
            id: EventId::new(e["id"].as_str().expect("id")).expect("valid id"),
            key: EventKey::new(e["key"].as_str().expect("key")).expect("valid key"),
            submitted_at_ms: e["submitted_at_ms"].as_u64().expect("submitted_at_ms"),
            publish_at_ms: e["publish_at_ms"].as_u64().expect("publish_at_ms"),
        })
        .collect();
    Snapshot {
        clock: GateClock::new(v["clock"].as_u64().expect("clock")).expect("clock"),
        incubating,
    }
}

fn update_of(v: &Value) -> StatusUpdate {
    StatusUpdate {
        clock: GateClock::new(v["clock"].as_u64().expect("clock")).expect("clock"),
        id: EventId::new(v["id"].as_str().expect("id")).expect("valid id"),
        key: EventKey::new(v["key"].as_str().expect("key")).expect("valid key"),
        status: EventStatus::parse(v["status"].as_str().expect("status")).expect("status"),
        at_ms: v["at_ms"].as_u64().expect("at_ms"),
        publish_at_ms: v["publish_at_ms"].as_u64().expect("publish_at_ms"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_subscriber_rebuilds_the_gate_from_snapshot_and_deltas() {
    let mut app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    // One event before the subscription, so the first snapshot is not empty.
    assert_eq!(
        submit(&client, &app, "strict", json!({"key": "early", "id": "x0"}))
            .await
            .0,
        202
    );
    let url = format!("ws://{}/v1/gates/strict/stream", app.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    let first = next(&mut ws).await;
    assert_eq!(first["type"], "snapshot", "{first}");
    assert_eq!(first["incubating"][0]["id"], "x0", "{first}");
    let mut replica = Replica::from_snapshot(snapshot_of(&first));
    // Submissions, a rejection with an invalidation, and publications.
    for (key, id) in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1")] {
        let (code, _) = submit(&client, &app, "strict", json!({"key": key, "id": id})).await;
        assert!(code == 202 || code == 409);
    }
    let mut seen = Vec::new();
    let mut last_clock = replica.clock();
    // Everything is published 600 ms after its submission; the replica must then match.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let frame = next(&mut ws).await;
        match frame["type"].as_str() {
            Some("status") => {
                let u = update_of(&frame);
                assert!(u.clock > last_clock, "clock order: {frame}");
                last_clock = u.clock;
                seen.push((u.id.as_str().to_owned(), u.status));
                replica.apply(&u).expect("a delta the replica accepts");
            }
            Some("snapshot") => {
                replica.apply_snapshot(snapshot_of(&frame));
            }
            other => panic!("unknown frame type {other:?}: {frame}"),
        }
        if replica.is_empty()
            && seen
                .iter()
                .filter(|s| s.1 == EventStatus::Published)
                .count()
                >= 3
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica never settled; seen {seen:?}"
        );
    }
    let (_, _, snap) = get(&client, &app, "/v1/gates/strict/snapshot").await;
    assert_eq!(replica.snapshot(), snapshot_of(&snap));
    assert!(
        seen.contains(&("a1".to_owned(), EventStatus::Invalidated)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("x0".to_owned(), EventStatus::Published)),
        "{seen:?}"
    );
    // An open stream does not hold the shutdown up.
    assert!(app.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_an_unknown_gate_is_refused_before_the_upgrade() {
    let app = App::start(GATES, &[]);
    let url = format!("ws://{}/v1/gates/nope/stream", app.addr);
    let err = tokio_tungstenite::connect_async(url)
        .await
        .expect_err("refused");
    match err {
        tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status().as_u16(), 404),
        other => panic!("expected an HTTP 404, got {other}"),
    }
}

/// The next message, whatever it is (fails after 5 s).
async fn recv(ws: &mut Ws) -> tokio_tungstenite::tungstenite::Message {
    common::ws_message(ws).await
}

/// The command, headers and body of a STOMP frame the server sent.
fn stomp(m: tokio_tungstenite::tungstenite::Message) -> (String, Vec<(String, String)>, String) {
    let text = m.into_text().expect("a text frame").as_str().to_owned();
    let body_at = text.find("\n\n").expect("headers end");
    let mut lines = text[..body_at].lines();
    let command = lines.next().expect("command").to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let body = text[body_at + 2..]
        .strip_suffix('\0')
        .expect("NUL-terminated")
        .to_owned();
    (command, headers, body)
}

/// Opens the `once` gate's stream asking for the `v12.stomp` subprotocol.
async fn stomp_stream(
    app: &App,
) -> (
    Ws,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut req = format!("ws://{}/v1/gates/once/stream", app.addr)
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v12.stomp".parse().expect("header"),
    );
    tokio_tungstenite::connect_async(req)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_speaks_stomp_1_2_when_the_client_asks_for_v12_stomp() {
    use futures::SinkExt as _;
    use tokio_tungstenite::tungstenite::Message;

    let mut app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    let (mut ws, resp) = stomp_stream(&app).await;
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.as_bytes()),
        Some(&b"v12.stomp"[..])
    );
    ws.send(Message::text(
        "CONNECT\naccept-version:1.2\nhost:gates\n\n\0",
    ))
    .await
    .expect("send");
    let (command, headers, _) = stomp(recv(&mut ws).await);
    assert_eq!(command, "CONNECTED");
    assert!(
        headers.contains(&("version".into(), "1.2".into())),
        "{headers:?}"
    );
    ws.send(Message::text(
        "SUBSCRIBE\nid:sub-0\ndestination:/topic/gates/once\n\n\0",
    ))
    .await
    .expect("send");
    let (command, headers, body) = stomp(recv(&mut ws).await);
    assert_eq!(command, "MESSAGE");
    assert!(
        headers.contains(&("subscription".into(), "sub-0".into())),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("destination".into(), "/topic/gates/once".into())),
        "{headers:?}"
    );
    let snap: Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(snap["type"], "snapshot");
    assert_eq!(
        submit(&client, &app, "once", json!({"key": "k", "id": "s1"}))
            .await
            .0,
        202
    );
    let (command, _, body) = stomp(recv(&mut ws).await);
    assert_eq!(command, "MESSAGE");
    let status: Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(
        (status["type"].as_str(), status["id"].as_str()),
        (Some("status"), Some("s1"))
    );
    ws.send(Message::text("DISCONNECT\nreceipt:77\n\n\0"))
        .await
        .expect("send");
    // The publication of s1 may come first; the receipt follows.
    loop {
        let m = recv(&mut ws).await;
        if m.is_close() {
            panic!("closed before the RECEIPT");
        }
        let (command, headers, _) = stomp(m);
        if command == "RECEIPT" {
            assert!(
                headers.contains(&("receipt-id".into(), "77".into())),
                "{headers:?}"
            );
            break;
        }
        assert_eq!(command, "MESSAGE");
    }
    assert!(app.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stomp_subscription_to_another_destination_is_an_error_frame() {
    use futures::SinkExt as _;
    use tokio_tungstenite::tungstenite::Message;

    let app = App::start(GATES, &[]);
    let (mut ws, _) = stomp_stream(&app).await;
    ws.send(Message::text("CONNECT\naccept-version:1.2\n\n\0"))
        .await
        .expect("send");
    let m = recv(&mut ws).await;
    assert_eq!(stomp(m).0, "CONNECTED");
    ws.send(Message::text(
        "SUBSCRIBE\nid:0\ndestination:/topic/gates/strict\n\n\0",
    ))
    .await
    .expect("send");
    let m = recv(&mut ws).await;
    let (command, _, body) = stomp(m);
    assert_eq!(command, "ERROR");
    assert!(body.contains("/topic/gates/once"), "{body}");
}
