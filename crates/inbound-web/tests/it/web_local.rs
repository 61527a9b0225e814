//! End-to-end tests of the real binary with the local provider: the exact JSON fields and
//! status codes of `/v1/evaluate`, the middleware's draft-11 headers (parsed as RFC 8941
//! Lists), problem+json, disabled mode, `--check`, exit codes, graceful shutdown.

use crate::common;

use common::{App, evaluate, keys, parse_sf_list};

const LOCAL: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 3
refill_amount = 1
refill_interval = "1h"
max_cost = 2

[rate_limit.policies.win]
algorithm = "fixed_window"
limit = 2
window = "1h"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"

[[routes]]
path_prefix = "/win"
policy = "win"
subject = "ip"
"#;

const EVALUATED_KEYS: [&str; 11] = [
    "allowed",
    "certainty",
    "limit",
    "outcome",
    "policy",
    "remaining",
    "reset_at_ms",
    "retry_after_ms",
    "revision",
    "source",
    "outcome",
];

fn evaluated_keys() -> Vec<String> {
    let mut k: Vec<String> = EVALUATED_KEYS[..10].iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

#[tokio::test]
async fn evaluate_answers_with_the_documented_fields_and_status_codes() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;

    let (status, retry, v) =
        evaluate(&c, &app, r#"{"policy":"api","subject":"user-42","cost":1}"#).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(retry, None);
    assert_eq!(keys(&v), evaluated_keys(), "{v}");
    assert_eq!(v["outcome"], "evaluated");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["limit"], 3);
    assert_eq!(v["remaining"], 2);
    assert_eq!(v["retry_after_ms"], 0);
    assert_eq!(v["policy"], "api");
    assert_eq!(v["revision"], 1);
    assert_eq!(v["source"], "local");
    assert_eq!(v["certainty"], "certain");
    let reset = v["reset_at_ms"]
        .as_u64()
        .expect("reset_at_ms is an integer");
    assert!(reset >= before, "reset_at_ms is Unix epoch ms: {reset}");

    // Defaults: policy = default_policy, cost = 1.
    let (status, _, v) = evaluate(&c, &app, r#"{"subject":"user-42"}"#).await;
    assert_eq!(
        (status, v["policy"].clone(), v["remaining"].clone()),
        (200, "api".into(), 1.into())
    );

    // Bad input: 400 problem+json, and nothing is consumed.
    for (body, error) in [
        (r#"{"policy":"nope","subject":"user-42"}"#, "unknown_policy"),
        (
            r#"{"policy":"api","subject":"user-42","cost":0}"#,
            "invalid_cost",
        ),
        (
            r#"{"policy":"api","subject":"user-42","cost":-1}"#,
            "invalid_cost",
        ),
        (
            r#"{"policy":"api","subject":"user-42","cost":3}"#,
            "invalid_cost",
        ),
        (r#"{"policy":"api","subject":"user-42""#, "malformed_json"),
        (
            r#"{"policy":"api","subject":"user-42","cost":1.5}"#,
            "malformed_json",
        ),
    ] {
        let r = c
            .post(app.url("/v1/evaluate"))
            .body(body)
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status().as_u16(), 400, "{body}");
        assert_eq!(
            r.headers()["content-type"].to_str().expect("ascii"),
            "application/problem+json"
        );
        let v: serde_json::Value = r.json().await.expect("problem JSON");
        assert_eq!(v["status"], 400);
        assert_eq!(v["error"], error, "{body}: {v}");
    }
    let long = "x".repeat(257);
    let (status, _, v) = evaluate(&c, &app, &format!(r#"{{"subject":"{long}"}}"#)).await;
    assert_eq!(
        (status, v["error"].clone()),
        (400, "subject_too_long".into())
    );
    let ok256 = "y".repeat(256);
    let (status, _, _) = evaluate(&c, &app, &format!(r#"{{"subject":"{ok256}"}}"#)).await;
    assert_eq!(status, 200, "256 bytes is the limit, not beyond it");

    // Still exactly one left for user-42: none of the 400s consumed anything.
    let (status, _, v) = evaluate(&c, &app, r#"{"subject":"user-42"}"#).await;
    assert_eq!((status, v["remaining"].clone()), (200, 0.into()), "{v}");

    // Denied: 429, same JSON shape, Retry-After in whole seconds rounded up.
    let (status, retry, v) = evaluate(&c, &app, r#"{"subject":"user-42"}"#).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(keys(&v), evaluated_keys());
    assert_eq!(v["allowed"], false);
    assert_eq!(v["remaining"], 0);
    let retry_ms = v["retry_after_ms"].as_u64().expect("integer");
    assert!(retry_ms > 0);
    let retry: u64 = retry
        .expect("Retry-After on 429")
        .parse()
        .expect("whole seconds");
    assert_eq!(retry, retry_ms.div_ceil(1000));

    // Another subject has its own quota.
    let (status, _, _) = evaluate(&c, &app, r#"{"subject":"user-43"}"#).await;
    assert_eq!(status, 200);
}

/// A GET of `path` on `app`, with `x-api-key: key` when there is one.
async fn get(c: &reqwest::Client, app: &App, path: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = c.get(app.url(path));
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.expect("GET")
}

fn status(r: &reqwest::Response) -> u16 {
    r.status().as_u16()
}

#[tokio::test]
async fn middleware_sends_draft_11_headers_then_a_quota_exceeded_problem_and_counts_it() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    for expected_r in [2, 1, 0] {
        let r = get(&c, &app, "/api/hello", Some("k1")).await;
        assert_eq!(status(&r), 200);
        let policy = parse_sf_list(r.headers()["ratelimit-policy"].to_str().expect("ascii"))
            .expect("RateLimit-Policy is an RFC 8941 List");
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].item, "api");
        assert_eq!(policy[0].param("q"), Some(3));
        // Token bucket: capacity per full refill time (3 tokens at 1 per hour = 3 h).
        assert_eq!(policy[0].param("w"), Some(3 * 3600));
        let limit = parse_sf_list(r.headers()["ratelimit"].to_str().expect("ascii"))
            .expect("RateLimit is an RFC 8941 List");
        assert_eq!(limit[0].item, "api");
        assert_eq!(limit[0].param("r"), Some(expected_r));
        let t = limit[0].param("t").expect("t");
        assert!((0..=3 * 3600).contains(&t), "t = {t}");
        assert!(r.headers().get("retry-after").is_none());
        let body: serde_json::Value = r.json().await.expect("JSON");
        assert_eq!(body, serde_json::json!({"ok": true}));
    }
    let r = get(&c, &app, "/api/hello", Some("k1")).await;
    assert_eq!(status(&r), 429);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("Retry-After is whole seconds");
    assert!((1..=3600).contains(&retry), "{retry}");
    parse_sf_list(r.headers()["ratelimit"].to_str().expect("ascii")).expect("RateLimit on 429");
    parse_sf_list(r.headers()["ratelimit-policy"].to_str().expect("ascii"))
        .expect("RateLimit-Policy on 429");
    let body: serde_json::Value = r.json().await.expect("problem JSON");
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["api"]));

    // Metrics count the decisions by policy and outcome.
    let text = common::metrics(&c, &app).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("rate_limit_decisions_total")
                && l.contains("policy=\"api\"")
                && l.contains("outcome=\"denied\"")
                && !l.ends_with(" 0")),
        "{text}"
    );
    assert!(
        text.contains("rate_limit_evaluation_duration_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test]
async fn middleware_limits_each_key_and_route_apart_and_leaves_unlimited_paths_bare() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    // Other keys are limited separately; requests without the header share one quota.
    assert_eq!(status(&get(&c, &app, "/api/x", Some("k2")).await), 200);
    for _ in 0..3 {
        assert_eq!(status(&get(&c, &app, "/api/x", None).await), 200);
    }
    assert_eq!(status(&get(&c, &app, "/api/x", None).await), 429);

    // `ip` subject and a fixed window: w is the window.
    for _ in 0..2 {
        let r = get(&c, &app, "/win", None).await;
        assert_eq!(status(&r), 200);
        let p =
            parse_sf_list(r.headers()["ratelimit-policy"].to_str().expect("ascii")).expect("list");
        assert_eq!((p[0].param("q"), p[0].param("w")), (Some(2), Some(3600)));
    }
    assert_eq!(status(&get(&c, &app, "/win/deeper", None).await), 429);

    // Unlimited paths carry no headers; unknown paths are 404.
    let r = get(&c, &app, "/healthz", None).await;
    assert_eq!(status(&r), 200);
    assert!(r.headers().get("ratelimit").is_none());
    assert_eq!(status(&get(&c, &app, "/apix", None).await), 404);
    assert_eq!(status(&get(&c, &app, "/readyz", None).await), 200);
}

#[tokio::test]
async fn disabled_by_default_passes_everything_and_evaluate_says_so() {
    let app = App::start(
        "[[routes]]\npath_prefix = \"/api\"\nsubject = \"ip\"\n",
        &[],
    );
    let c = reqwest::Client::new();
    let (status, _, v) = evaluate(&c, &app, r#"{"subject":"user-42"}"#).await;
    assert_eq!(status, 503);
    assert_eq!(v, serde_json::json!({"error": "rate_limit_disabled"}));
    for _ in 0..20 {
        let r = c.get(app.url("/api/x")).send().await.expect("GET");
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers().get("ratelimit").is_none());
    }
    assert!(
        app.log().contains("rate limiting disabled"),
        "{}",
        app.log()
    );
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let mut app = App::start(LOCAL, &[]);
    let status = app.terminate();
    assert!(status.success(), "{status:?}\n{}", app.log());
}

#[test]
fn invalid_configuration_exits_2_with_one_line_per_problem() {
    let out = common::run(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n\n[rate_limit.policies.api]\nalgorithm = \"token_bucket\"\ncapacity = 0\nrefill_amount = 1\nrefill_interval = \"1s\"\nwindow = \"1s\"\n",
        &[],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rate_limit."))
        .collect();
    assert!(
        lines.contains(&"rate_limit.policies.api.capacity: must be >= 1, got 0"),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("rate_limit.policies.api.window:")),
        "{stderr}"
    );
    // Same through --check, and an environment override is validated like a file key.
    let out = common::run(
        "",
        &["--check"],
        &[
            ("APP_RATE_LIMIT__ENABLED", "true"),
            ("APP_RATE_LIMIT__PROVIDER", "memcached"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("rate_limit.provider: ")),
        "{stderr}"
    );
}

#[test]
fn environment_sets_numbers_booleans_and_digit_secrets() {
    // Every kind of key from the process environment: whole numbers and booleans are written
    // as text there, and a secret of digits only must stay the same text.
    let digits = "01234567890123456789012345678901234";
    let out = common::run(
        "",
        &["--check"],
        &[
            ("APP_HTTP__WORKER_THREADS", "1"),
            ("APP_RATE_LIMIT__ENABLED", "true"),
            ("APP_RATE_LIMIT__PROVIDER", "redis"),
            ("APP_RATE_LIMIT__DEFAULT_POLICY", "api"),
            ("APP_RATE_LIMIT__SUBJECT_SECRET", digits),
            ("APP_RATE_LIMIT__REDIS__ROLE", "coordination"),
            ("APP_RATE_LIMIT__REDIS__URL", "redis://127.0.0.1:6379/0"),
            ("APP_RATE_LIMIT__REDIS__MAX_IN_FLIGHT", "2048"),
            ("APP_RATE_LIMIT__POLICIES__API__ALGORITHM", "fixed_window"),
            ("APP_RATE_LIMIT__POLICIES__API__LIMIT", "7"),
            ("APP_RATE_LIMIT__POLICIES__API__WINDOW", "1s"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for line in ["worker_threads = 1", "max_in_flight = 2048", "limit = 7"] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in:\n{stdout}"
        );
    }
    assert!(!stdout.contains(digits), "{stdout}");
    // A value that is not a whole number is named by its key path and shown.
    let out = common::run(
        "",
        &["--check"],
        &[("APP_RATE_LIMIT__LOCAL__MAX_KEYS", "5x")],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l == r#"rate_limit.local.max_keys: must be a whole number, got "5x""#),
        "{stderr}"
    );
}

#[test]
fn check_prints_effective_settings_with_secrets_redacted() {
    let config = format!(
        "[rate_limit]\nenabled = true\nprovider = \"redis\"\ndefault_policy = \"api\"\nsubject_secret = \"{}\"\n\n[rate_limit.redis]\nrole = \"coordination\"\nurl = \"redis://limiter:pw-do-not-print@127.0.0.1:6379/0\"\n\n[rate_limit.policies.api]\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1s\"\nburst = 5\n",
        common::SECRET
    );
    let out = common::run(&config, &["--check"], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains(common::SECRET), "{all}");
    assert!(!all.contains("pw-do-not-print"), "{all}");
    assert!(stdout.contains("<redacted>"), "{stdout}");
    assert!(
        stdout.contains("command_timeout = \"50ms\""),
        "defaults are filled in: {stdout}"
    );
    assert!(stdout.contains("[rate_limit.policies.api]"), "{stdout}");
    // An environment secret is redacted the same way.
    let out = common::run(
        &config.replace(&format!("subject_secret = \"{}\"\n", common::SECRET), ""),
        &["--check"],
        &[(
            "APP_RATE_LIMIT__SUBJECT_SECRET",
            "env-secret-env-secret-env-secret-42",
        )],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("env-secret"));
}

#[tokio::test]
async fn evaluation_spans_never_carry_the_raw_subject() {
    let app = App::start(LOCAL, &[("RUST_LOG", "trace")]);
    let c = reqwest::Client::new();
    let subject = "raw-subject-must-not-be-logged-7f3a";
    let (status, _, _) = evaluate(&c, &app, &format!(r#"{{"subject":"{subject}"}}"#)).await;
    assert_eq!(status, 200);
    let r = c
        .get(app.url("/api/x"))
        .header("x-api-key", subject)
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    // The log thread may lag the response a little.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let log = app.log();
    assert!(
        log.contains("rate_limit.evaluate"),
        "a span per evaluation:\n{log}"
    );
    assert!(log.contains("policy=api"), "{log}");
    assert!(
        !log.contains(subject),
        "the raw subject leaked into the log:\n{log}"
    );
}

#[tokio::test]
async fn an_evaluate_body_that_is_an_array_is_malformed_json_and_charges_nothing() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    // serde would read a struct from an array by position: `["api","s",2]` as policy, subject
    // and cost. The documented body is an object.
    for body in [r#"["api","s",2]"#, r#"["api","s"]"#, "[]", r#""api""#, "7"] {
        let (status, _, v) = evaluate(&c, &app, body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"], "malformed_json", "{body}: {v}");
    }
    // The whole quota of 3 is still there: one charge leaves 2.
    let (status, _, v) = evaluate(&c, &app, r#"{"policy":"api","subject":"s"}"#).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["remaining"], 2, "nothing was charged before: {v}");
}

/// One rule with gRPC, which refuses an empty descriptor value: an empty subject is no
/// subject, so `"subject": ""` is `missing_subject` and nothing is charged.
#[tokio::test]
async fn an_empty_subject_is_missing_subject_and_charges_nothing() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    for body in [
        r#"{"policy":"api","subject":""}"#,
        r#"{"subject":"","cost":2}"#,
        r#"{"requests":[{"policy":"win","subject":"s"},{"policy":"api","subject":""}]}"#,
    ] {
        let (status, _, v) = evaluate(&c, &app, body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"], "missing_subject", "{body}: {v}");
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("subject must not be empty"), "{detail}");
    }
    // The list's first entry was not charged either: `win` still has both places for "s".
    let (status, _, v) = evaluate(&c, &app, r#"{"policy":"win","subject":"s"}"#).await;
    assert_eq!((status, v["remaining"].clone()), (200, 1.into()), "{v}");
}

/// The middleware reads a subject header that is present but empty as the absent header it
/// equals: both are the empty subject, one shared quota (never a way around the limit).
#[tokio::test]
async fn middleware_counts_an_empty_subject_header_as_the_missing_one() {
    let app = App::start(LOCAL, &[]);
    let c = reqwest::Client::new();
    for key in [Some(""), None, Some("")] {
        let r = get(&c, &app, "/api/x", key).await;
        assert_eq!(status(&r), 200, "{key:?}");
    }
    let r = get(&c, &app, "/api/x", None).await;
    assert_eq!(status(&r), 429, "the capacity of 3 was shared");
}
