//! The gate stream on the real binary loses no terminal frame at its periodic snapshot.
//!
//! The defect this guards against: the 5 s snapshot moved the subscriber's cursor to the
//! snapshot's clock, so the updates not yet pulled were never sent. Here the subscriber (a
//! socket with a 4 KiB receive buffer) stops reading from 4.5 s to 5.6 s after its first
//! snapshot while events are submitted and published all along, across the tick; every event
//! it saw as submitted must be seen to end. This end-to-end run is a regression check of the
//! whole path (it does not hit the old race every time: the server's socket buffer often takes
//! the stall); the deterministic reproduction, a port whose snapshot is read above updates
//! nobody pulled, is in the acceptance tests' `gate_stream.rs`.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::App;
use futures::StreamExt as _;
use serde_json::{Value, json};
use shared_contract::gate::{
    EventId, EventKey, EventStatus, GateClock, IncubatingEvent, Replica, Snapshot, StatusUpdate,
};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

const GATES: &str = r#"
[event_gates.tick]
mode = "only_once"
duration = "1s"
retention = "1m"
max_events = 100000
"#;

type Ws = WebSocketStream<tokio::net::TcpStream>;

/// A subscriber whose socket takes at most a few KiB before the server has to wait.
async fn small_window_subscriber(app: &App, gate: &str) -> Ws {
    let url = app.url(&format!("/v1/gates/{gate}/stream"));
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .parse()
        .expect("socket address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("connect");
    let ws_url = url.replacen("http://", "ws://", 1);
    let (ws, _) = tokio_tungstenite::client_async(ws_url, stream)
        .await
        .expect("upgrade");
    ws
}

fn u(v: &Value, name: &str) -> u64 {
    v[name].as_u64().unwrap_or_else(|| panic!("{name} in {v}"))
}

fn s<'a>(v: &'a Value, name: &str) -> &'a str {
    v[name].as_str().unwrap_or_else(|| panic!("{name} in {v}"))
}

/// The model subscriber: the replica of the frames and which events it saw begin and end.
#[derive(Default)]
struct Subscriber {
    replica: Replica,
    submitted: HashSet<String>,
    ended: HashSet<String>,
}

impl Subscriber {
    fn take(&mut self, frame: &Value) {
        let clock = GateClock::new(u(frame, "clock")).expect("clock");
        if frame["type"] == "snapshot" {
            let incubating = frame["incubating"].as_array().expect("incubating");
            let incubating = incubating
                .iter()
                .map(|e| {
                    self.submitted.insert(s(e, "id").to_owned());
                    IncubatingEvent {
                        id: EventId::new(s(e, "id")).expect("id"),
                        key: EventKey::new(s(e, "key")).expect("key"),
                        submitted_at_ms: u(e, "submitted_at_ms"),
                        publish_at_ms: u(e, "publish_at_ms"),
                    }
                })
                .collect();
            self.replica.apply_snapshot(Snapshot { clock, incubating });
            return;
        }
        let status = EventStatus::parse(s(frame, "status")).expect("status");
        let id = s(frame, "id").to_owned();
        let update = StatusUpdate {
            clock,
            id: EventId::new(&id).expect("id"),
            key: EventKey::new(s(frame, "key")).expect("key"),
            status,
            at_ms: u(frame, "at_ms"),
            publish_at_ms: u(frame, "publish_at_ms"),
        };
        self.replica.apply(&update).expect("the update fits");
        if status == EventStatus::Submitted {
            self.submitted.insert(id);
        } else {
            self.ended.insert(id);
        }
    }

    fn missed(&self) -> usize {
        self.submitted.difference(&self.ended).count()
    }
}

/// Submits events of fresh keys every 5 ms from `from` to `until` after `t0`.
async fn submitter(app_url: String, tag: usize, t0: Instant, from: Duration, until: Duration) {
    let client = reqwest::Client::new();
    tokio::time::sleep_until((t0 + from).into()).await;
    let mut n = 0;
    while t0.elapsed() < until {
        let body = json!({"key": format!("k{tag}-{n}"), "id": format!("e{tag}-{n}")});
        let _ = client.post(&app_url).json(&body).send().await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_terminal_frame_is_lost_at_the_periodic_snapshot() {
    let app = App::start(GATES, &[]);
    let mut ws = small_window_subscriber(&app, "tick").await;
    let mut sub = Subscriber::default();
    let first = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    let first = first.expect("a snapshot").expect("open").expect("frame");
    let t0 = Instant::now();
    sub.take(&serde_json::from_str(first.to_text().expect("text")).expect("JSON"));
    let url = app.url("/v1/gates/tick/events");
    let submitters: Vec<_> = (0..2)
        .map(|tag| {
            let url = url.clone();
            let (from, until) = (Duration::from_millis(3000), Duration::from_millis(6500));
            tokio::spawn(submitter(url, tag, t0, from, until))
        })
        .collect();
    let stall = (Duration::from_millis(4500), Duration::from_millis(5600));
    let mut stalled = false;
    // Read until 9 s after the first snapshot (the last events end by 7.5 s), stalling once.
    while t0.elapsed() < Duration::from_secs(9) {
        if !stalled && t0.elapsed() >= stall.0 {
            stalled = true;
            tokio::time::sleep_until((t0 + stall.1).into()).await;
        }
        let Ok(next) = tokio::time::timeout(Duration::from_millis(200), ws.next()).await else {
            continue;
        };
        match next.expect("open").expect("frame") {
            Message::Text(t) => sub.take(&serde_json::from_str(t.as_str()).expect("JSON")),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
    for s in submitters {
        s.await.expect("submitter");
    }
    assert!(sub.submitted.len() > 100, "{} events", sub.submitted.len());
    assert_eq!(
        sub.missed(),
        0,
        "of {} events seen submitted, {} were never seen to end",
        sub.submitted.len(),
        sub.missed()
    );
}
