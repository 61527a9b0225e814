//! End-to-end tests of the event gates on the real binary with the redis provider (each on
//! its own `redis-server`): two instances share one gate, so a conflict is detected across
//! them, and a subscriber of one instance sees the events submitted on the other.

use crate::common;

use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use common::{App, Ws};
use futures::StreamExt as _;
use serde_json::{Value, json};

fn config(url: &str) -> String {
    let rate_limit = common::redis_rate_limit(url, "fail_closed", "");
    format!(
        r#"{rate_limit}
[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 10
window = "1h"

[event_gates.orders]
mode = "strictly_once"
duration = "400ms"
"#
    )
}

async fn submit(client: &reqwest::Client, app: &App, body: Value) -> (u16, Value) {
    let r = client
        .post(app.url("/v1/gates/orders/events"))
        .json(&body)
        .send()
        .await
        .expect("POST events");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_gate_and_one_stream() {
    let server = RedisServer::start();
    let cfg = config(server.url());
    let mut a = App::start(&cfg, &[]);
    let mut b = App::start(&cfg, &[]);
    let client = reqwest::Client::new();
    let mut ws = subscribe(&b.addr).await;

    let (code, first) = submit(&client, &a, json!({"key": "taco", "id": "t1"})).await;
    assert_eq!(code, 202, "{first}");
    // The conflict is seen by the other instance: t2 rejected, t1 invalidated.
    let (code, second) = submit(&client, &b, json!({"key": "taco", "id": "t2"})).await;
    assert_eq!(code, 409, "{second}");
    assert_eq!(second["conflicts_with"], "t1");
    let (code, _) = submit(&client, &a, json!({"key": "apple", "id": "a1"})).await;
    assert_eq!(code, 202);

    // B's subscriber: snapshot, then t1 submitted, t1 invalidated, a1 submitted, a1
    // published (by either instance's publisher), in clock order.
    let mut statuses = Vec::new();
    let mut last = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !statuses.contains(&("a1".to_owned(), "published".to_owned())) {
        assert!(Instant::now() < deadline, "saw only {statuses:?}");
        let v = common::ws_json(&mut ws).await;
        if v["type"] == "status" {
            let clock = v["clock"].as_u64().expect("clock");
            assert!(clock > last, "clock order: {v}");
            last = clock;
            statuses.push((
                v["id"].as_str().unwrap_or("").to_owned(),
                v["status"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    let want = [
        ("t1", "submitted"),
        ("t1", "invalidated"),
        ("a1", "submitted"),
        ("a1", "published"),
    ];
    let got: Vec<(&str, &str)> = statuses
        .iter()
        .map(|(i, s)| (i.as_str(), s.as_str()))
        .collect();
    assert_eq!(got, want);
    let r = client
        .get(a.url("/v1/gates/orders/events/a1"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(body["status"], "published");
    assert!(a.terminate().success());
    assert!(b.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_503_problem_json_and_the_gate_recovers() {
    let mut server = RedisServer::start();
    let app = App::start(&config(server.url()), &[]);
    let client = reqwest::Client::new();
    assert_eq!(
        submit(&client, &app, json!({"key": "k", "id": "before"}))
            .await
            .0,
        202
    );
    server.stop();
    let r = client
        .post(app.url("/v1/gates/orders/events"))
        .json(&json!({"key": "k2", "id": "during"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(
        r.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..])
    );
    let body: Value = r.json().await.expect("JSON");
    assert!(
        body["outcome"] == "unavailable" || body["outcome"] == "indeterminate",
        "{body}"
    );
    let r = client
        .get(app.url("/v1/gates/orders/snapshot"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 503);
    server.restart();
    // Back within a few seconds (the pool reconnects); a retry with the same id is safe.
    eventually(
        "the retried submission accepted",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || match submit(&client, &app, json!({"key": "k2", "id": "during"})).await {
            (202 | 200, _) => Ok(()),
            (code, body) => {
                assert_eq!(code, 503, "{body}");
                Err(body)
            }
        },
    )
    .await;
}

/// Opens the gate's stream at `addr` and waits for its snapshot frame. A test must not submit
/// before that: the snapshot is read after the upgrade, so an event submitted in between
/// would be in the snapshot instead of arriving as a `submitted` status frame.
async fn subscribe(addr: &str) -> Ws {
    let url = format!("ws://{addr}/v1/gates/orders/stream");
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    let first = common::ws_json(&mut ws).await;
    assert_eq!(first["type"], "snapshot", "{first}");
    ws
}

/// Collects (clock, id, status) of status frames until `until` or the stream ends.
async fn collect(mut ws: Ws, until: Instant) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    while let Ok(Some(Ok(m))) =
        tokio::time::timeout(until.saturating_duration_since(Instant::now()), ws.next()).await
    {
        let Ok(text) = m.into_text() else { break };
        let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
            break;
        };
        if v["type"] == "status" {
            out.push((
                v["clock"].as_u64().unwrap_or(0),
                v["id"].as_str().unwrap_or("").to_owned(),
                v["status"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_of_two_instances_see_the_same_updates_and_none_is_lost_when_one_dies() {
    let server = RedisServer::start();
    let cfg = config(server.url());
    let a = App::start(&cfg, &[]);
    let mut b = App::start(&cfg, &[]);
    let client = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(4);
    let sub_a = tokio::spawn(collect(subscribe(&a.addr).await, until));
    let sub_b = tokio::spawn(collect(subscribe(&b.addr).await, until));
    // 40 events over 8 keys, alternating instances; A is killed halfway.
    let mut submitted = Vec::new();
    let mut a = Some(a);
    for i in 0..40 {
        if i == 20 {
            drop(a.take()); // SIGKILL
        }
        let target = match (&a, i % 2) {
            (Some(a), 0) => a,
            _ => &b,
        };
        let id = format!("e{i}");
        let (code, body) = submit(
            &client,
            target,
            json!({"key": format!("k{}", i % 8), "id": id}),
        )
        .await;
        assert!(code == 202 || code == 409, "{body}");
        if code == 202 {
            submitted.push(id);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let seen_a = sub_a.await.expect("subscriber a");
    let seen_b = sub_b.await.expect("subscriber b");
    // Same updates, same clock order: A's view is a prefix of B's.
    assert!(!seen_a.is_empty());
    assert_eq!(seen_a[..], seen_b[..seen_a.len()]);
    assert!(seen_b.windows(2).all(|w| w[0].0 < w[1].0));
    // Every submitted event ends published or invalidated exactly once.
    for id in &submitted {
        let terminal: Vec<&str> = seen_b
            .iter()
            .filter(|(_, i, s)| i == id && s != "submitted")
            .map(|(_, _, s)| s.as_str())
            .collect();
        assert!(
            terminal == ["published"] || terminal == ["invalidated"],
            "{id}: {terminal:?}"
        );
    }
    assert!(b.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_examples_give_the_documented_answers_on_redis_in_both_modes() {
    let server = RedisServer::start();
    let cfg = config(server.url()).replace(
        "[event_gates.orders]\nmode = \"strictly_once\"\nduration = \"400ms\"",
        "[event_gates.once]\nmode = \"only_once\"\nduration = \"600ms\"\n\n\
         [event_gates.strict]\nmode = \"strictly_once\"\nduration = \"600ms\"",
    );
    let mut app = App::start(&cfg, &[]);
    let client = reqwest::Client::new();
    let post = |gate: &'static str, key: &'static str, id: &'static str| {
        let client = client.clone();
        let url = app.url(&format!("/v1/gates/{gate}/events"));
        async move {
            let r = client
                .post(url)
                .json(&json!({"key": key, "id": id}))
                .send()
                .await
                .expect("POST");
            r.status().as_u16()
        }
    };
    // Units of 200 ms.
    let start = Instant::now();
    let mut codes = Vec::new();
    for (at, key, id) in common::WORKED_EXAMPLE {
        tokio::time::sleep_until((start + Duration::from_millis(at * 200)).into()).await;
        codes.push((post("once", key, id).await, post("strict", key, id).await));
    }
    assert_eq!(
        codes,
        [(202, 202), (202, 202), (409, 409), (409, 409), (202, 202)]
    );
    tokio::time::sleep_until((start + Duration::from_millis(11 * 200 + 400)).into()).await;
    for (gate, id, want) in common::WORKED_EXAMPLE_FATES {
        let r = client
            .get(app.url(&format!("/v1/gates/{gate}/events/{id}")))
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), 200, "{gate}/{id}");
        let body: Value = r.json().await.expect("JSON");
        assert_eq!(body["status"], want, "{gate}/{id}: {body}");
    }
    assert!(app.terminate().success());
}
