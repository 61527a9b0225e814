//! The gate stream's subscriber bound on the real binary: at most 256 subscribers per gate;
//! the next upgrade is refused with 503 problem+json before any socket exists, and a place
//! freed by a closed subscriber is usable again.

use crate::common;

use std::time::Duration;

use common::App;
use inbound_web::gates::subscribers::MAX_SUBSCRIBERS_PER_GATE;
use tokio_tungstenite::tungstenite::Error as WsError;

const GATES: &str = r#"
[event_gates.bound]
mode = "only_once"
duration = "1s"
"#;

#[tokio::test]
async fn the_subscriber_after_the_bound_gets_503_problem_json() {
    let app = App::start(GATES, &[]);
    let url = app
        .url("/v1/gates/bound/stream")
        .replacen("http://", "ws://", 1);
    let mut open = Vec::new();
    for n in 0..MAX_SUBSCRIBERS_PER_GATE {
        let (ws, _) = tokio_tungstenite::connect_async(&url)
            .await
            .unwrap_or_else(|e| panic!("subscriber {n}: {e}"));
        open.push(ws);
    }
    match tokio_tungstenite::connect_async(&url).await {
        Err(WsError::Http(r)) => {
            assert_eq!(r.status().as_u16(), 503);
            let h = r.headers();
            assert_eq!(h["content-type"], "application/problem+json");
            assert_eq!(h["retry-after"], "1");
            let body = String::from_utf8(r.body().clone().unwrap_or_default()).expect("utf-8");
            assert!(body.contains("too_many_subscribers"), "{body}");
        }
        other => panic!("expected a 503 refusal, got {other:?}"),
    }
    let mut first = open.remove(0);
    first.close(None).await.expect("close");
    drop(first);
    // The server frees the place when its connection ends.
    let mut admitted = false;
    for _ in 0..50 {
        if tokio_tungstenite::connect_async(&url).await.is_ok() {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "a freed place is usable again");
}
