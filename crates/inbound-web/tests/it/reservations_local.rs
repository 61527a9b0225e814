//! Reservations on the real binary over the local provider: many concurrent reserve and
//! settle pairs charge exactly the actual costs, a settle retried concurrently charges once,
//! and the metrics count every call.

use crate::common;

use common::{App, sample};

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "tokens"

[rate_limit.policies.tokens]
algorithm = "fixed_window"
limit = 10000000
window = "24h"
max_cost = 1000

[rate_limit.policies.requests]
algorithm = "fixed_window"
limit = 100000
window = "24h"
"#;

pub(crate) async fn post(
    c: &reqwest::Client,
    url: String,
    body: String,
) -> (u16, serde_json::Value) {
    let r = c.post(url).body(body).send().await.expect("an answer");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

/// What `policy` has left for `subject` (an evaluation of cost 1, which charges it), and
/// when its window resets.
pub(crate) async fn remaining(
    c: &reqwest::Client,
    app: &App,
    policy: &str,
    subject: &str,
) -> (u64, u64) {
    let body = format!(r#"{{"policy":"{policy}","subject":"{subject}"}}"#);
    let (status, d) = post(c, app.url("/v1/evaluate"), body).await;
    assert_eq!(status, 200, "{d}");
    let reset = d["reset_at_ms"].as_u64().expect("reset_at_ms");
    (d["remaining"].as_u64().expect("remaining") + 1, reset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserve_and_settle_pairs_charge_the_actual_costs() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    let pairs = 2_000usize;
    // Spread around the estimate of 500 (a fixed permutation of 300..=700): some below
    // (refunded), some above (charged more).
    let actuals: Vec<u64> = (0..pairs as u64).map(|i| 300 + i * 7_919 % 401).collect();
    let (_, window) = remaining(&c, &app, "tokens", "team-1").await;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::with_capacity(pairs);
    for &actual in &actuals {
        let (c, gate) = (c.clone(), gate.clone());
        let (reserve, base) = (app.url("/v1/reservations"), app.url("/v1/reservations/"));
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.expect("open");
            let body = r#"{"requests":[{"policy":"tokens","subject":"team-1","cost":500},
                {"policy":"requests","subject":"team-1"}],"ttl_ms":60000}"#;
            let (status, r) = post(&c, reserve, body.to_owned()).await;
            assert_eq!(status, 201, "{r}");
            let id = r["reservation_id"].as_str().expect("an id");
            let settle = format!("{base}{id}/settle");
            let (status, s) = post(&c, settle, format!(r#"{{"actual":[{actual},1]}}"#)).await;
            assert_eq!(status, 200, "{s}");
            assert_eq!(s["charged"], serde_json::json!([actual, 1]));
        }));
    }
    for t in tasks {
        t.await.expect("no panic");
    }
    let charged: u64 = actuals.iter().sum();
    let (tokens, reset) = remaining(&c, &app, "tokens", "team-1").await;
    let (requests, _) = remaining(&c, &app, "requests", "team-1").await;
    // Exact unless the day's window ended during the test (then the counts restarted).
    if reset == window {
        assert_eq!(tokens, 10_000_000 - 1 - charged);
        assert_eq!(requests, 100_000 - pairs as u64);
    }
    let m = common::metrics(&c, &app).await;
    let series = |op: &str, outcome: &str| {
        format!("rate_limit_reservations_total{{operation=\"{op}\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(sample(&m, &series("reserve", "reserved")), pairs as f64);
    assert_eq!(sample(&m, &series("settle", "settled")), pairs as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_retried_concurrently_charges_once() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    let body = r#"{"requests":[{"policy":"tokens","subject":"team-2","cost":100}]}"#;
    let (status, r) = post(&c, app.url("/v1/reservations"), body.to_owned()).await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["expires_in_ms"], 30_000, "the default ttl");
    let id = r["reservation_id"].as_str().expect("an id").to_owned();
    let settle = app.url(&format!("/v1/reservations/{id}/settle"));
    let tries = (0..10u64).map(|i| {
        let (c, url) = (c.clone(), settle.clone());
        tokio::spawn(async move { post(&c, url, format!(r#"{{"actual":[{}]}}"#, 50 + i)).await })
    });
    let mut answers = Vec::new();
    for t in tries {
        let (status, s) = t.await.expect("no panic");
        assert_eq!(status, 200, "{s}");
        answers.push(s);
    }
    let first: Vec<_> = answers
        .iter()
        .filter(|s| s.get("replayed").is_none())
        .collect();
    assert_eq!(first.len(), 1, "{answers:?}");
    let charged = first[0]["charged"][0].as_u64().expect("charged");
    assert!(
        answers.iter().all(|s| s["charged"][0] == charged),
        "{answers:?}"
    );
    let (left, _) = remaining(&c, &app, "tokens", "team-2").await;
    assert!(left == 10_000_000 - charged || left == 10_000_000, "{left}");
}
