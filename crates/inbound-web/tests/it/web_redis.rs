//! End-to-end tests of the real binary with the redis provider, each on its own
//! `redis-server` (the acceptance-tests harness): disabled mode opens no connection, two
//! instances sharing one Redis enforce one limit exactly, and a Redis outage is answered per
//! the failure policy and recovered from within 2 s, and a `deny_cache` policy answers a
//! repeated denial locally.

use crate::common;

use std::time::{Duration, Instant};

use acceptance_tests::eventually::eventually;
use acceptance_tests::redis_server::RedisServer;
use common::{App, SECRET, evaluate};

fn redis_config(url: &str, failure_policy: &str, policy: &str, extra_redis: &str) -> String {
    let rate_limit = common::redis_rate_limit(url, failure_policy, extra_redis);
    format!(
        r#"{rate_limit}
[rate_limit.policies.api]
{policy}

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"
"#
    )
}

/// Connected clients other than the asking one.
fn other_clients(server: &RedisServer) -> usize {
    let mut conn = server.connection();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut conn)
        .expect("CLIENT LIST");
    list.lines().filter(|l| !l.trim().is_empty()).count() - 1
}

#[tokio::test]
async fn disabled_with_a_redis_url_configured_opens_no_connection() {
    let server = RedisServer::start();
    let config = format!(
        "[rate_limit]\nprovider = \"redis\"\ndefault_policy = \"api\"\nsubject_secret = \"{SECRET}\"\n\n[rate_limit.redis]\nrole = \"coordination\"\nurl = \"{}\"\n\n[rate_limit.policies.api]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n\n[[routes]]\npath_prefix = \"/api\"\nsubject = \"ip\"\n",
        server.url()
    );
    let app = App::start(&config, &[]);
    let c = reqwest::Client::new();
    for _ in 0..5 {
        assert_eq!(
            c.get(app.url("/api/x"))
                .send()
                .await
                .expect("GET")
                .status()
                .as_u16(),
            200
        );
    }
    let (status, _, _) = evaluate(&c, &app, r#"{"subject":"s"}"#).await;
    assert_eq!(status, 503);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(other_clients(&server), 0, "disabled mode must not connect");
    drop(app);

    // The control: the same configuration enabled does connect (so the check can fail).
    let app = App::start(
        &config.replace("[rate_limit]\n", "[rate_limit]\nenabled = true\n"),
        &[],
    );
    let (status, _, v) = evaluate(&c, &app, r#"{"subject":"s"}"#).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["source"], "global_redis");
    assert!(other_clients(&server) >= 1);
}

#[tokio::test]
async fn two_instances_sharing_one_redis_admit_exactly_the_limit() {
    let server = RedisServer::start();
    // 50 tokens, refilled at 1 per hour: no refill during the test, so exactly 50 admits.
    let policy =
        "algorithm = \"token_bucket\"\ncapacity = 50\nrefill_amount = 1\nrefill_interval = \"1h\"";
    // A generous command timeout: 200 concurrent requests on a 2-core machine shared with the
    // load generator must not turn into indeterminate outcomes.
    let config = redis_config(
        server.url(),
        "fail_closed",
        policy,
        "command_timeout = \"2s\"",
    );
    let a = App::start(&config, &[]);
    let b = App::start(&config, &[]);
    let c = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = if i % 2 == 0 {
            a.url("/v1/evaluate")
        } else {
            b.url("/v1/evaluate")
        };
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .body(r#"{"policy":"api","subject":"shared-subject"}"#)
                .send()
                .await
                .expect("POST");
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.expect("JSON");
            (status, v)
        }));
    }
    let mut allowed = 0;
    let mut denied = 0;
    for t in tasks {
        let (status, v) = t.await.expect("task");
        match status {
            200 => {
                assert_eq!(v["source"], "global_redis", "{v}");
                allowed += 1;
            }
            429 => denied += 1,
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    assert_eq!((allowed, denied), (50, 150));

    // The middleware route shares the same Redis state across both instances too.
    let hdr = |app: &App| c.get(app.url("/api/x")).header("x-api-key", "k").send();
    let mut ok = 0;
    for i in 0..60 {
        let r = if i % 2 == 0 { hdr(&a) } else { hdr(&b) }
            .await
            .expect("GET");
        if r.status().as_u16() == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 50);
}

#[tokio::test]
async fn redis_outage_follows_the_failure_policy_and_recovers_within_two_seconds() {
    let mut server = RedisServer::start();
    let policy = "algorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1h\"";
    let closed = App::start(&redis_config(server.url(), "fail_closed", policy, ""), &[]);
    let fallback = App::start(
        &redis_config(server.url(), "fallback_local", policy, ""),
        &[],
    );
    let open = App::start(&redis_config(server.url(), "fail_open", policy, ""), &[]);
    let c = reqwest::Client::new();
    let body = r#"{"subject":"user-42"}"#;
    for app in [&closed, &fallback, &open] {
        let (status, _, v) = evaluate(&c, app, body).await;
        assert_eq!(
            (status, v["source"].clone()),
            (200, "global_redis".into()),
            "{v}"
        );
    }

    server.stop();
    // Enough requests to see both the provider's own answer and the open circuit.
    for _ in 0..8 {
        let (status, retry, v) = evaluate(&c, &closed, body).await;
        assert_eq!(status, 503, "{v}");
        assert!(
            v["outcome"] == "unavailable" || v["outcome"] == "indeterminate",
            "{v}"
        );
        let secs: u64 = retry
            .expect("Retry-After on 503")
            .parse()
            .expect("whole seconds");
        assert!(secs >= 1, "{secs}");
        assert!(
            v.get("allowed").is_none(),
            "fail_closed reports no allow: {v}"
        );

        let r = c
            .get(closed.url("/api/x"))
            .header("x-api-key", "k")
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), 503);
        assert!(r.headers().get("retry-after").is_some());
        assert_eq!(r.headers()["content-type"], "application/problem+json");

        let (status, _, v) = evaluate(&c, &fallback, body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["outcome"], "evaluated");
        assert_eq!(v["source"], "local_fallback");
        assert_eq!(v["certainty"], "approximate_fallback");

        let (status, _, v) = evaluate(&c, &open, body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["allowed"], true, "{v}");
        assert!(
            v["outcome"] == "unavailable" || v["outcome"] == "indeterminate",
            "{v}"
        );
    }
    let r = c.get(closed.url("/readyz")).send().await.expect("GET");
    assert_eq!(r.status().as_u16(), 503);
    let r = c.get(fallback.url("/readyz")).send().await.expect("GET");
    assert_eq!(r.status().as_u16(), 200, "fallback_local keeps serving");
    let metrics = common::metrics(&c, &closed).await;
    assert!(
        metrics.contains("rate_limit_circuit_breaker_state 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rate_limit_provider_errors_total")
                && l.contains("circuit_open")
                && !l.ends_with(" 0")),
        "{metrics}"
    );

    server.restart();
    let back = Instant::now();
    for app in [&closed, &fallback, &open] {
        // One bound for all three: 2 s from Redis returning.
        let left = Duration::from_secs(2).saturating_sub(back.elapsed());
        eventually(
            "a global_redis decision after Redis returned",
            left,
            Duration::from_millis(20),
            async || match evaluate(&c, app, body).await {
                (200, _, v) if v["source"] == "global_redis" => Ok(()),
                (status, _, v) => Err(format!("{status} {v}")),
            },
        )
        .await;
    }
    let recovered = back.elapsed();
    eprintln!("recovered {recovered:?} after Redis returned");
    assert!(recovered < Duration::from_secs(2), "{recovered:?}");
    assert!(closed.log().contains("circuit breaker"), "{}", closed.log());
}

#[tokio::test]
async fn a_repeated_denial_of_a_deny_cache_policy_is_answered_locally() {
    let server = RedisServer::start();
    let policy = "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\ndeny_cache = true";
    let app = App::start(&redis_config(server.url(), "fail_closed", policy, ""), &[]);
    let c = reqwest::Client::new();
    let mut sources = Vec::new();
    for _ in 0..3 {
        let (status, _, v) = evaluate(&c, &app, r#"{"subject":"hot"}"#).await;
        sources.push((status, v["allowed"].clone(), v["source"].clone()));
    }
    let expect = |status: u16, allowed: bool, source: &str| {
        (
            status,
            serde_json::json!(allowed),
            serde_json::json!(source),
        )
    };
    assert_eq!(
        sources,
        [
            expect(200, true, "global_redis"),
            expect(429, false, "global_redis"),
            expect(429, false, "local_cache"),
        ]
    );
    let text = common::metrics(&c, &app).await;
    let by = |source: &str| {
        let series =
            format!("rate_limit_decisions_by_source_total{{policy=\"api\",source=\"{source}\"}}");
        common::sample(&text, &series)
    };
    assert_eq!(
        (by("global_redis"), by("local_cache")),
        (2.0, 1.0),
        "{text}"
    );
    assert_eq!(
        common::sample(&text, "rate_limit_deny_cache_entries"),
        1.0,
        "{text}"
    );
}
