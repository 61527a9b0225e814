//! Leases on the real binary over the local provider: a `[[routes]]` rule of a concurrency
//! policy releases each request's lease when its response has been sent (so sequential
//! requests never run out of places), a lease released late answers 410, and the lease
//! metrics count every answer.

use crate::common;

use common::{App, sample};

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 100
window = "1h"

[rate_limit.policies.jobs]
algorithm = "concurrency"
limit = 1
lease_ttl = "300ms"

[[routes]]
path_prefix = "/work"
policy = "jobs"
subject = "header:x-user"
"#;

#[tokio::test]
async fn a_routes_lease_is_released_when_its_response_is_sent() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    // One place only: each request must have given its lease back for the next to pass.
    for i in 0..20 {
        let r = c
            .get(app.url("/work/x"))
            .header("x-user", "w-1")
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.text().await.expect("a body"), r#"{"ok":true}"#);
    }
    let m = common::metrics(&c, &app).await;
    let series =
        |outcome: &str| format!("rate_limit_leases_total{{policy=\"jobs\",outcome=\"{outcome}\"}}");
    let (acquired, released) = (
        sample(&m, &series("acquired")),
        sample(&m, &series("released")),
    );
    assert_eq!((acquired, released), (20.0, 20.0), "{m}");
}

#[tokio::test]
async fn a_lease_released_after_its_expiry_is_answered_gone_and_frees_nothing() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    let acquire = || {
        c.post(app.url("/v1/leases"))
            .body(r#"{"policy":"jobs","subject":"w-2"}"#)
            .send()
    };
    let first: serde_json::Value = acquire()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    let id = first["lease_id"].as_str().expect("a lease id").to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // Expired: another caller takes the place, then the late release frees nothing.
    let second = acquire().await.expect("an answer");
    assert_eq!(second.status(), 201);
    let late = c
        .delete(app.url(&format!("/v1/leases/{id}")))
        .send()
        .await
        .expect("an answer");
    assert!(
        [404, 410].contains(&late.status().as_u16()),
        "expired or reclaimed: {}",
        late.status()
    );
    let third = acquire().await.expect("an answer");
    assert_eq!(
        third.status(),
        429,
        "the second lease still holds the place"
    );
    assert!(third.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn a_lease_body_that_is_an_array_is_malformed_json_and_holds_nothing() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    let acquire = |body: &'static str| c.post(app.url("/v1/leases")).body(body).send();
    for body in [r#"["jobs","w-3"]"#, "[]"] {
        let r = acquire(body).await.expect("an answer");
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(
            r.headers().get("content-type").map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..])
        );
        let v: serde_json::Value = r.json().await.expect("JSON");
        assert_eq!(v["error"], "malformed_json", "{body}: {v}");
    }
    // The policy's one place is still free.
    let r = acquire(r#"{"policy":"jobs","subject":"w-3"}"#)
        .await
        .expect("an answer");
    assert_eq!(r.status(), 201, "no lease was held by the arrays");
}

/// An empty subject is no subject, as on `/v1/evaluate` and over gRPC: acquiring with one is
/// `missing_subject` (nothing held), and so is releasing with `?subject=`.
#[tokio::test]
async fn an_empty_subject_is_missing_subject_and_holds_nothing() {
    let app = App::start(CONFIG, &[]);
    let c = reqwest::Client::new();
    let r = c
        .post(app.url("/v1/leases"))
        .body(r#"{"policy":"jobs","subject":""}"#)
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(v["error"], "missing_subject", "{v}");
    let held: serde_json::Value = c
        .post(app.url("/v1/leases"))
        .body(r#"{"policy":"jobs","subject":"w-4"}"#)
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON");
    let id = held["lease_id"].as_str().expect("a lease id");
    let r = c
        .delete(app.url(&format!("/v1/leases/{id}?subject=")))
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(v["error"], "missing_subject", "{v}");
}
