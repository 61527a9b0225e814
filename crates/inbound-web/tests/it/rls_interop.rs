//! The gRPC rate-limit service of the real binary, asked by a client that is not ours:
//! `tests/python/rls_client.py` on grpcio and xds-protos (Envoy's generated Python stubs).
//!
//! Skipped, saying so, when python3 or those modules are missing, unless
//! `RLS_PYTHON_REQUIRED` is set (CI sets it, and installs them): then a missing module fails.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use acceptance_tests::redis_server::RedisServer;
use common::App;
use serde_json::{Value, json};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/rls_client.py")
}

/// Whether the Python client can run; panics when it cannot and it is required.
fn python_ready() -> bool {
    let checked = Command::new("python3")
        .arg(script())
        .arg("--check-modules")
        .output();
    let why = match &checked {
        Ok(out) if out.status.success() => return true,
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(e) => format!("python3: {e}"),
    };
    assert!(
        std::env::var_os("RLS_PYTHON_REQUIRED").is_none(),
        "RLS_PYTHON_REQUIRED is set but the Python client cannot run: {why}"
    );
    eprintln!(
        "SKIPPED: the Python interop test needs python3 with grpcio and xds-protos \
         (python3 -m pip install grpcio xds-protos): {why}"
    );
    false
}

/// Sends `requests` in order and returns one answer each.
fn ask(addr: &str, requests: &Value) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(script())
        .arg(addr)
        .arg(requests.to_string())
        .output()
        .expect("run the Python client");
    assert!(
        out.status.success(),
        "rls_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Value = serde_json::from_slice(&out.stdout).expect("the client prints JSON");
    answers.as_array().cloned().expect("a list of answers")
}

const POLICIES: &str = r#"
[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 1
window = "1m"

[rate_limit.policies.tenant]
algorithm = "fixed_window"
limit = 5
window = "1m"
max_cost = 5

[grpc]
bind = "127.0.0.1:0"

[[rls.descriptors]]
domain = "edge"
entries = ["remote_address"]
policy = "api"

[[rls.descriptors]]
domain = "edge"
entries = ["tenant"]
policy = "tenant"
"#;

fn request(hits: u32, descriptors: &[&[(&str, &str)]]) -> Value {
    json!({ "domain": "edge", "hits": hits, "descriptors": descriptors })
}

#[test]
fn envoy_python_client_sees_statuses_headers_and_all_or_nothing() {
    if !python_ready() {
        return;
    }
    let config = format!(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n{POLICIES}"
    );
    let app = App::start(&config, &[]);
    let both: &[&[(&str, &str)]] = &[&[("remote_address", "10.0.0.1")], &[("tenant", "t1")]];
    let answers = ask(
        &app.grpc_addr(),
        &json!([
            request(1, both),
            request(1, both),
            request(1, &[&[("tenant", "t1")]]),
            request(1, &[&[("unknown", "x")]]),
            request(6, &[&[("tenant", "t2")]]),
            json!({ "domain": "", "hits": 1, "descriptors": [[["tenant", "t1"]]] }),
        ]),
    );
    let [first, second, tenant, unknown, too_costly, no_domain] = &answers[..] else {
        panic!("six answers: {answers:?}");
    };
    assert_eq!(first["overall_code"], "OK", "{first}");
    assert_eq!(
        first["statuses"][0]["limit"],
        json!({"name": "api", "requests_per_unit": 1, "unit": "MINUTE"})
    );
    assert_eq!(first["statuses"][1]["remaining"], 4, "{first}");
    assert!(
        first["statuses"][0]["reset_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= 60_000)
    );
    assert_eq!(
        first["headers"]["RateLimit-Policy"],
        "\"api\";q=1;w=60, \"tenant\";q=5;w=60"
    );
    assert!(first["headers"].get("Retry-After").is_none(), "{first}");

    assert_eq!(second["overall_code"], "OVER_LIMIT", "{second}");
    assert_eq!(second["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(
        second["statuses"][1]["code"], "OK",
        "the tenant would admit"
    );
    assert!(
        second["headers"]["Retry-After"].as_str().is_some(),
        "{second}"
    );
    // The refused request charged the tenant nothing: 4 left before the next one, 3 after.
    assert_eq!(tenant["statuses"][0]["remaining"], 3, "{tenant}");

    assert_eq!(
        unknown["overall_code"], "OK",
        "unknown_descriptor defaults to allow"
    );
    assert_eq!(unknown["statuses"][0]["limit"], Value::Null);
    assert_eq!(too_costly["error"], "INVALID_ARGUMENT", "{too_costly}");
    assert_eq!(no_domain["error"], "INVALID_ARGUMENT", "{no_domain}");
}

#[test]
fn envoy_python_client_sees_the_failure_policy_when_redis_is_down() {
    if !python_ready() {
        return;
    }
    let mut server = RedisServer::start();
    let app = |failure: &str| {
        let rate_limit = common::redis_rate_limit(server.url(), failure, "");
        App::start(&format!("{rate_limit}\n{POLICIES}"), &[])
    };
    let closed = app("fail_closed");
    let open = app("fail_open");
    let one = json!([request(1, &[&[("tenant", "t9")]])]);
    assert_eq!(ask(&closed.grpc_addr(), &one)[0]["overall_code"], "OK");
    server.stop();
    let down = ask(&closed.grpc_addr(), &one);
    let error = down[0]["error"].as_str().unwrap_or("none");
    assert!(
        ["UNAVAILABLE", "UNKNOWN"].contains(&error),
        "fail_closed is a gRPC error status: {down:?}"
    );
    let through = ask(&open.grpc_addr(), &one);
    assert_eq!(through[0]["overall_code"], "OK", "fail_open: {through:?}");
}

#[test]
fn envoy_python_client_checks_at_0_and_charges_the_stream_done_tokens() {
    if !python_ready() {
        return;
    }
    const TOKENS: &str = "[rate_limit.policies.tokens]\nalgorithm = \"fixed_window\"\nlimit = 1000\n\
         window = \"1h\"\nmax_cost = 1000\n\n[[rls.descriptors]]\ndomain = \"llm\"\n\
         entries = [\"user\"]\npolicy = \"tokens\"\ncharge = \"after\"\n";
    let server = RedisServer::start();
    let local = format!(
        "[rate_limit]\nenabled = true\nprovider = \"local\"\ndefault_policy = \"api\"\n{POLICIES}\n{TOKENS}"
    );
    let redis = format!(
        "{}\n{POLICIES}\n{TOKENS}",
        common::redis_rate_limit(server.url(), "fail_closed", "")
    );
    for (provider, config) in [("local", local), ("redis", redis)] {
        let app = App::start(&config, &[]);
        // As Envoy Gateway generates them: at request time the descriptor with hits_addend
        // 0, at stream end the same descriptor with the tokens the answer used.
        let call = |hits: u64| json!({ "domain": "llm", "hits": 0, "descriptors": [[["user", "u1"]]], "descriptor_hits": [hits] });
        let answers = ask(
            &app.grpc_addr(),
            &json!([call(0), call(600), call(600), call(0)]),
        );
        let [check, done, past, refused] = &answers[..] else {
            panic!("{provider}: four answers: {answers:?}");
        };
        assert_eq!(check["overall_code"], "OK", "{provider}: {check}");
        assert_eq!(
            check["statuses"][0]["remaining"], 999,
            "{provider}: {check}"
        );
        assert_eq!(done["statuses"][0]["remaining"], 400, "{provider}: {done}");
        assert_eq!(
            past["overall_code"], "OK",
            "{provider}: charged past the limit: {past}"
        );
        assert_eq!(past["statuses"][0]["remaining"], 0, "{provider}: {past}");
        assert_eq!(
            refused["overall_code"], "OVER_LIMIT",
            "{provider}: {refused}"
        );
    }
}
