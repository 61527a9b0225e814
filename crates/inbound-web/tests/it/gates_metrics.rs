//! Event-gate metrics on the real binary: submissions by answer, publications seen by the
//! built-in observer with their lag, the incubating gauge and the subscriber gauge.

use crate::common;

use std::time::Duration;

use common::App;
use serde_json::json;

const GATES: &str = r#"
[event_gates.metered]
mode = "only_once"
duration = "300ms"
"#;

async fn metrics(client: &reqwest::Client, app: &App) -> String {
    client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of the sample line starting with `series` (name and labels), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

async fn eventually(client: &reqwest::Client, app: &App, series: &str, want: f64) -> String {
    let mut last = String::new();
    for _ in 0..100 {
        last = metrics(client, app).await;
        if sample(&last, series) == Some(want) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{series} never reached {want}:\n{last}");
}

#[tokio::test]
async fn submissions_publications_lag_and_subscribers_are_exported() {
    let app = App::start(GATES, &[]);
    let client = reqwest::Client::new();
    let submit = |key: &str, id: &str| {
        client
            .post(app.url("/v1/gates/metered/events"))
            .json(&json!({"key": key, "id": id}))
            .send()
    };
    assert_eq!(submit("a", "e-1").await.expect("e-1").status(), 202);
    assert_eq!(submit("a", "e-2").await.expect("e-2").status(), 409);
    assert_eq!(submit("b", "e-3").await.expect("e-3").status(), 202);
    assert_eq!(submit("b", "e-3").await.expect("retry").status(), 200);
    let text = metrics(&client, &app).await;
    let s = |outcome: &str| {
        sample(
            &text,
            &format!("event_gate_submissions_total{{gate=\"metered\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(s("submitted"), Some(2.0), "{text}");
    assert_eq!(s("rejected"), Some(1.0), "{text}");
    assert_eq!(s("duplicate"), Some(1.0), "{text}");

    let text = eventually(
        &client,
        &app,
        "event_gate_published_total{gate=\"metered\"}",
        2.0,
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "event_gate_publication_lag_seconds_count{gate=\"metered\"}"
        ),
        Some(2.0),
        "{text}"
    );
    eventually(
        &client,
        &app,
        "event_gate_incubating{gate=\"metered\"}",
        0.0,
    )
    .await;

    let url = app
        .url("/v1/gates/metered/stream")
        .replacen("http://", "ws://", 1);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("subscriber");
    eventually(
        &client,
        &app,
        "event_gate_subscribers{gate=\"metered\"}",
        1.0,
    )
    .await;
    ws.close(None).await.expect("close");
    drop(ws);
    eventually(
        &client,
        &app,
        "event_gate_subscribers{gate=\"metered\"}",
        0.0,
    )
    .await;
}
