//! Leases on the real binary over Redis: a holder that crashes (SIGKILL, nothing released)
//! loses its leases to their expiry on Redis's clock, so another instance acquires again
//! within `lease_ttl` of the crash (plus a small margin), and not before the leases expire;
//! and a route's lease is back on Redis by the time its client has the whole response.

use crate::common;

use std::time::{Duration, Instant};

use acceptance_tests::redis_server::RedisServer;
use common::App;
use serde_json::Value;

const TTL_MS: u64 = 2_000;

fn config(url: &str) -> String {
    let rate_limit = common::redis_rate_limit(url, "fail_closed", "");
    format!(
        r#"{rate_limit}
[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 10
window = "1h"

[rate_limit.policies.jobs]
algorithm = "concurrency"
limit = 3
lease_ttl = "{TTL_MS}ms"

[rate_limit.policies.one]
algorithm = "concurrency"
limit = 1
lease_ttl = "60s"

[[routes]]
path_prefix = "/work"
policy = "one"
subject = "header:x-user"
"#
    )
}

/// `POST /v1/leases` for subject `worker-1`: the status, `Retry-After` and the body.
async fn acquire(c: &reqwest::Client, app: &App) -> (u16, Option<String>, Value) {
    let r = c
        .post(app.url("/v1/leases"))
        .body(r#"{"policy":"jobs","subject":"worker-1"}"#)
        .send()
        .await
        .expect("an answer");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = serde_json::from_str(&r.text().await.expect("a body")).expect("JSON");
    (status, retry, body)
}

fn ms(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_leases_are_reclaimed_within_their_ttl_and_not_before() {
    let server = RedisServer::start();
    let config = config(server.url());
    let mut holder = App::start(&config, &[]);
    let other = App::start(&config, &[]);
    let c = reqwest::Client::new();
    let mut expiries = Vec::new();
    for i in 0..3 {
        let (status, _, v) = acquire(&c, &holder).await;
        assert_eq!(status, 201, "lease {i}: {v}");
        assert_eq!(ms(&v, "lease_ttl_ms"), TTL_MS);
        expiries.push(ms(&v, "expires_at_ms"));
    }
    let (status, retry, v) = acquire(&c, &other).await;
    assert_eq!(status, 429, "the other instance sees the places held: {v}");
    assert_eq!(v["error"], "lease_limit_reached");
    assert!(retry.is_some(), "429 says when to retry");

    holder.kill();
    let killed = Instant::now();
    let earliest_expiry = expiries.iter().copied().min().expect("three leases");
    let lease = loop {
        let (status, _, v) = acquire(&c, &other).await;
        if status == 201 {
            break v;
        }
        assert_eq!(status, 429, "{v}");
        assert!(
            killed.elapsed() < Duration::from_millis(TTL_MS + 1_000),
            "still denied {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let reclaimed_after = killed.elapsed();
    // On Redis's clock: the new lease was acquired at expires_at - ttl, which is no earlier
    // than the first of the killed holder's leases expired.
    let acquired_at = ms(&lease, "expires_at_ms") - ms(&lease, "lease_ttl_ms");
    assert!(
        acquired_at >= earliest_expiry,
        "acquired at {acquired_at}, before the first lease expired at {earliest_expiry}"
    );
    assert!(
        reclaimed_after <= Duration::from_millis(TTL_MS + 500),
        "reclaimed {reclaimed_after:?} after the kill, lease_ttl {TTL_MS} ms"
    );
    eprintln!(
        "a killed holder's place reclaimed {reclaimed_after:?} after SIGKILL (lease_ttl {TTL_MS} ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_lease_is_back_before_the_client_has_the_whole_response() {
    let server = RedisServer::start();
    let app = App::start(&config(server.url()), &[]);
    let c = reqwest::Client::new();
    // One place and a 60 s lease: a lease still held when the next request arrives is a 429.
    for i in 0..30 {
        let r = c
            .get(app.url("/work/x"))
            .header("x-user", "w-1")
            .send()
            .await
            .expect("an answer");
        let status = r.status();
        let body = r.text().await.expect("a body");
        assert_eq!(status, 200, "request {i}: {body}");
    }
}
