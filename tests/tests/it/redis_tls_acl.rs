//! The Redis provider over TLS (server-auth and mutual) and as a least-privilege ACL user,
//! on servers the harness starts. Certificates come from `openssl` into a temp dir.
//!
//! The start-up ACL check: the least-privilege users documented in `docs/operations.md`
//! (read from it) pass it for rate limits and for gates; a user missing a command, or whose
//! key pattern excludes the prefix, is refused before any program runs (readiness names what
//! is missing, every evaluation is `Incompatible(program)`, nothing is written).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use acceptance_tests::rate::{self, TestPolicy, policy_set, subject};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{RedisProvider, RedisSettings, TlsFiles};
use shared_contract::{
    AlgorithmKind, Deadline, EdgeRateLimitPort, PolicyId, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, UnavailableCategory,
};

/// Two per day under `api`: the limit is reached within a test and never refills.
fn policy() -> RateLimitPolicy {
    TestPolicy::of(
        "api",
        AlgorithmKind::FixedWindow,
        2,
        Duration::from_secs(86_400),
    )
    .max_clock_regression(Duration::from_secs(2))
    .build()
}

fn request(tag: u8) -> RateLimitRequest {
    rate::request(&policy(), subject(tag), 1)
}

fn openssl(dir: &Path, args: &str) {
    let status = Command::new("bash")
        .arg("-c")
        .arg(format!("openssl {args}"))
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args}");
}

/// A CA, a server certificate for 127.0.0.1/localhost and a client certificate.
///
/// Made once per test process: tests run in parallel, and regenerating the files under a
/// server that already loaded them would make its certificates unverifiable mid-test.
fn pki() -> PathBuf {
    static PKI: OnceLock<PathBuf> = OnceLock::new();
    PKI.get_or_init(make_pki).clone()
}

fn make_pki() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rl-pki-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("pki dir");
    openssl(
        &dir,
        "req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 30 -keyout ca.key -out ca.crt -subj /CN=test-ca",
    );
    openssl(
        &dir,
        "req -new -nodes -newkey rsa:2048 -keyout server.key -out server.csr -subj /CN=localhost",
    );
    openssl(
        &dir,
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 30 -out server.crt -extfile <(printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\nsubjectAltName=IP:127.0.0.1,DNS:localhost\\n')",
    );
    openssl(
        &dir,
        "req -new -nodes -newkey rsa:2048 -keyout client.key -out client.csr -subj /CN=limiter",
    );
    openssl(
        &dir,
        "x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 30 -out client.crt -extfile <(printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=clientAuth\\n')",
    );
    // A second CA that signed nothing here: the server must not verify against it.
    openssl(
        &dir,
        "req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 30 -keyout other.key -out other.crt -subj /CN=other-ca",
    );
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn tls_server(pki: &Path, auth_clients: &str) -> (RedisServer, u16) {
    let port = free_port();
    let p = |f: &str| pki.join(f).display().to_string();
    let args = [
        "--tls-port".to_owned(),
        port.to_string(),
        "--tls-cert-file".to_owned(),
        p("server.crt"),
        "--tls-key-file".to_owned(),
        p("server.key"),
        "--tls-ca-cert-file".to_owned(),
        p("ca.crt"),
        "--tls-auth-clients".to_owned(),
        auth_clients.to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (RedisServer::start_with(&args), port)
}

async fn provider(settings: RedisSettings) -> RedisProvider {
    RedisProvider::connect(settings, policy_set(vec![policy()]))
        .await
        .expect("settings are valid")
}

fn allowed(outcome: &RateLimitOutcome) -> Option<bool> {
    match outcome {
        RateLimitOutcome::Evaluated(d) => Some(d.allowed),
        _ => None,
    }
}

/// Two allowed then one denied: the limit is enforced through this connection.
async fn enforces(p: &RedisProvider, tag: u8) {
    let got: Vec<Option<bool>> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(allowed(
                &p.evaluate(request(tag)).await.expect("valid request"),
            ));
        }
        v
    };
    assert_eq!(got, vec![Some(true), Some(true), Some(false)]);
}

fn tls_settings(port: u16, files: TlsFiles) -> RedisSettings {
    let mut s = RedisSettings::new(format!("rediss://127.0.0.1:{port}/0"));
    s.tls = files;
    s.command_timeout = Duration::from_millis(500);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_server_auth_and_mutual_tls_enforce_limits_and_refuse_what_does_not_verify() {
    let pki = pki();
    let ca = |f: &str| Some(pki.join(f));
    let (_server_auth, port) = tls_server(&pki, "no");
    let (_mutual, mport) = tls_server(&pki, "yes");

    // Server-auth TLS, CA checked, IP SAN matched.
    let p = provider(tls_settings(
        port,
        TlsFiles {
            ca_file: ca("ca.crt"),
            ..TlsFiles::default()
        },
    ))
    .await;
    enforces(&p, 1).await;

    // A CA that did not sign the server certificate: never connected, nothing sent.
    let p = provider(tls_settings(
        port,
        TlsFiles {
            ca_file: ca("other.crt"),
            ..TlsFiles::default()
        },
    ))
    .await;
    assert!(matches!(
        p.evaluate(request(2)).await.expect("valid request"),
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));

    // Mutual TLS: without a client certificate the server refuses the handshake ...
    let p = provider(tls_settings(
        mport,
        TlsFiles {
            ca_file: ca("ca.crt"),
            ..TlsFiles::default()
        },
    ))
    .await;
    assert!(allowed(&p.evaluate(request(3)).await.expect("valid request")).is_none());
    // ... and with one it is enforced.
    let p = provider(tls_settings(
        mport,
        TlsFiles {
            ca_file: ca("ca.crt"),
            cert_file: ca("client.crt"),
            key_file: ca("client.key"),
        },
    ))
    .await;
    enforces(&p, 4).await;
    let _ = std::fs::remove_dir_all(&pki);
}

#[test]
fn tls_settings_that_cannot_work_are_start_up_errors_naming_the_key() {
    let cases = [
        ("rediss://127.0.0.1:1/0", TlsFiles::default(), "tls_ca_file"),
        (
            "redis://127.0.0.1:1/0",
            TlsFiles {
                ca_file: Some("/nonexistent/ca.crt".into()),
                ..TlsFiles::default()
            },
            "rediss://",
        ),
        (
            "rediss://127.0.0.1:1/0",
            TlsFiles {
                ca_file: Some("/nonexistent/ca.crt".into()),
                ..TlsFiles::default()
            },
            "/nonexistent/ca.crt",
        ),
    ];
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for (url, files, needle) in cases {
        let mut s = RedisSettings::new(url);
        s.tls = files;
        let err = rt
            .block_on(RedisProvider::connect(s, policy_set(vec![policy()])))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(needle), "{url}: {err}");
        assert!(err.contains("rate_limit.redis."), "{url}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_from_settings_is_enough_and_a_wrong_password_is_never_an_allow()
{
    let [rate_rules, _] = documented_acl_rules();
    let mut args = vec!["--user", "limiter", "on", ">s3cret-pass"];
    args.extend(rate_rules.iter().map(String::as_str));
    let server = RedisServer::start_with(&args);
    let mut s = RedisSettings::new(server.url());
    s.username = Some("limiter".to_owned());
    s.password = Some("s3cret-pass".to_owned());
    s.command_timeout = Duration::from_millis(500);
    let p = provider(s.clone()).await;
    enforces(&p, 5).await;

    s.password = Some("wrong".to_owned());
    let p = provider(s).await;
    assert!(matches!(
        p.evaluate(request(6)).await.expect("valid request"),
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_refused_under_strict_and_only_warned_otherwise() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let mut s = RedisSettings::new(server.url());
    s.command_timeout = Duration::from_millis(500);
    let lenient = provider(s.clone()).await;
    enforces(&lenient, 7).await;

    s.strict_eviction_policy = true;
    let strict = provider(s).await;
    let outcome = strict.evaluate(request(8)).await.expect("valid request");
    assert!(
        matches!(outcome, RateLimitOutcome::Incompatible { .. }),
        "{outcome:?}"
    );
    match strict.readiness().await {
        shared_contract::Readiness::NotReady(why) => {
            assert!(why.contains("allkeys-lru"), "{why}");
        }
        other => panic!("strict provider on allkeys-lru must not be ready: {other:?}"),
    }

    // noeviction is fine even under strict.
    let safe = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let mut s = RedisSettings::new(safe.url());
    s.command_timeout = Duration::from_millis(500);
    s.strict_eviction_policy = true;
    enforces(&provider(s).await, 9).await;
}

// ---- The start-up ACL check ----------------------------------------------------------------

/// The rules of the documented least-privilege users, `docs/operations.md` "TLS and ACL":
/// `[rate limits, rate limits and gates]`, each as the rules after `>PASSWORD`.
fn documented_acl_rules() -> [Vec<String>; 2] {
    let doc = include_str!("../../../docs/operations.md");
    let lines: Vec<Vec<String>> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("user limiter on >PASSWORD "))
        .map(|rules| rules.split_whitespace().map(str::to_owned).collect())
        .collect();
    match <[Vec<String>; 2]>::try_from(lines) {
        Ok(both) => both,
        Err(got) => panic!(
            "operations.md documents 2 limiter users, found {}",
            got.len()
        ),
    }
}

/// `ACL SETUSER name reset on >PASSWORD rules...` through a default-user connection.
fn acl_user<S: AsRef<str>>(server: &RedisServer, name: &str, rules: &[S]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(format!(">{PASSWORD}"));
    for r in rules {
        cmd.arg(r.as_ref());
    }
    let _: () = cmd.query(&mut server.connection()).expect("ACL SETUSER");
}

/// A password that must never appear in a reason.
const PASSWORD: &str = "pw-never-printed-7Qx";

fn as_user(server: &RedisServer, user: &str) -> RedisSettings {
    let mut s = RedisSettings::new(server.url());
    s.username = Some(user.to_owned());
    s.password = Some(PASSWORD.to_owned());
    s.command_timeout = Duration::from_millis(500);
    s
}

/// `rules` without the ones listed in `drop`.
fn without(rules: &[String], drop: &[&str]) -> Vec<String> {
    rules
        .iter()
        .filter(|r| !drop.contains(&r.as_str()))
        .cloned()
        .collect()
}

/// `rules` with the key pattern `~rl:*` replaced by `~app:*`: every command, on other keys.
fn on_other_keys(rules: &[String]) -> Vec<String> {
    rules
        .iter()
        .map(|r| {
            if r == "~rl:*" {
                "~app:*".to_owned()
            } else {
                r.clone()
            }
        })
        .collect()
}

fn not_ready(readiness: shared_contract::Readiness, who: &str) -> String {
    match readiness {
        shared_contract::Readiness::NotReady(why) => {
            assert!(!why.contains(PASSWORD), "{who}: {why}");
            why
        }
        shared_contract::Readiness::Ready => panic!("{who}: ready although the check refused"),
    }
}

/// No key was written and no data command ran (the check runs none of the commands it
/// probes; a program that ran would show `TIME`, `GET` or a refused call in commandstats).
fn nothing_ran(server: &RedisServer, who: &str) {
    let mut c = server.connection();
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
    assert_eq!(keys, 0, "{who}: state was written");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO commandstats");
    for cmd in [
        "evalsha", "time", "get", "set", "incr", "hset", "zadd", "xadd",
    ] {
        let line = format!("cmdstat_{cmd}:");
        assert!(!stats.contains(&line), "{who}: {cmd} ran:\n{stats}");
    }
}

fn gate_set() -> shared_contract::gate::GateSet {
    use shared_contract::gate::{GateId, GateMode, GateSet, GateSettings, GateSpec};
    let spec = GateSpec::new(
        GateId::new("orders").expect("gate id"),
        GateMode::OnlyOnce,
        Duration::from_secs(60),
    );
    GateSet::new(vec![GateSettings::new(spec).expect("gate")]).expect("gate set")
}

async fn gate_provider(settings: RedisSettings) -> adapter_redis::RedisGateProvider {
    let gs = adapter_redis::RedisGateSettings {
        run_publisher: false,
        ..adapter_redis::RedisGateSettings::default()
    };
    adapter_redis::RedisGateProvider::connect(settings, gate_set(), gs)
        .await
        .expect("settings are valid")
}

async fn submit(
    p: &adapter_redis::RedisGateProvider,
    id: &str,
) -> shared_contract::gate::GateOutcome<shared_contract::gate::SubmitOutcome> {
    use shared_contract::gate::{EventGatePort, EventId, EventKey, GateId, SubmitRequest};
    p.submit(SubmitRequest {
        gate: GateId::new("orders").expect("gate id"),
        key: EventKey::new("customer-1").expect("key"),
        id: EventId::new(id).expect("id"),
        deadline: Deadline::within(Duration::from_secs(10)).expect("deadline"),
    })
    .await
    .expect("known gate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_least_privilege_users_pass_the_acl_check_for_rate_limits_and_gates() {
    use shared_contract::Readiness;
    use shared_contract::gate::{EventGatePort, GateOutcome, SubmitOutcome};
    let [rate_rules, gate_rules] = documented_acl_rules();
    let server = RedisServer::start();
    acl_user(&server, "rates", &rate_rules);
    acl_user(&server, "gates", &gate_rules);

    // Rate limits: ready before the first request, and the limit holds.
    for user in ["rates", "gates"] {
        let p = provider(as_user(&server, user)).await;
        assert_eq!(p.readiness().await, Readiness::Ready, "{user}");
    }
    enforces(&provider(as_user(&server, "rates")).await, 10).await;

    // Gates: the gate user passes the gate provider's check and submits.
    let g = gate_provider(as_user(&server, "gates")).await;
    assert_eq!(EventGatePort::readiness(&g).await, Readiness::Ready);
    assert!(
        matches!(
            submit(&g, "e1").await,
            GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
        ),
        "the gate user submits"
    );

    // The rate-limit user is not enough for gates: the gate provider checks its own programs'
    // needs and says so before anything is written under the gate's keys.
    let g = gate_provider(as_user(&server, "rates")).await;
    let why = not_ready(EventGatePort::readiness(&g).await, "rates on gates");
    for needle in [
        "INCR",
        "XADD",
        "XINFO|STREAM",
        "gate-submit-v1.lua",
        "+xadd",
    ] {
        assert!(why.contains(needle), "{needle}: {why}");
    }
    assert!(
        !why.contains(" SET on") && !why.contains("TIME"),
        "SET and TIME are granted: {why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_missing_a_permission_is_incompatible_from_the_first_request_and_nothing_runs() {
    use shared_contract::IncompatibleCategory;
    let [rate_rules, _] = documented_acl_rules();
    let server = RedisServer::start();
    let other_keys = on_other_keys(&rate_rules);
    // (user, rules, what the reason must name)
    let cases: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        (
            "noset",
            without(&rate_rules, &["+set"]),
            vec![
                "ACL user \"noset\" may not run SET on \"rl:*\" keys",
                "rate-token-bucket-v2.lua",
                "grant +set ~rl:*",
            ],
        ),
        (
            "notime",
            without(&rate_rules, &["+time"]),
            vec!["may not run TIME (used by rate-", "grant +time"],
        ),
        (
            "otherkeys",
            other_keys,
            vec![
                "EVALSHA on \"rl:*\" keys",
                "GET on \"rl:*\" keys",
                "SET on \"rl:*\" keys",
                "~rl:*",
            ],
        ),
        (
            "noevalsha",
            without(&rate_rules, &["+evalsha"]),
            vec!["may not run EVALSHA on \"rl:*\" keys", "grant +evalsha"],
        ),
        (
            "noeval",
            without(&rate_rules, &["+eval", "+evalsha"]),
            vec!["may not run EVAL", "grant +eval +evalsha"],
        ),
    ];
    for (user, rules, _) in &cases {
        acl_user(&server, user, rules);
    }
    for (user, _, needles) in &cases {
        let p = provider(as_user(&server, user)).await;
        // Known before any request: the check refused the connection, no program was run.
        let why = not_ready(p.readiness().await, user);
        for needle in needles {
            assert!(why.contains(needle), "{user}: {needle:?} not in {why}");
        }
        for tag in [20, 21] {
            assert_eq!(
                p.evaluate(request(tag)).await.expect("valid request"),
                RateLimitOutcome::Incompatible {
                    policy_id: PolicyId::new("api").expect("id"),
                    category: IncompatibleCategory::Program,
                },
                "{user}"
            );
        }
        nothing_ran(&server, user);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_evaluates_and_missing_rights_are_incompatible_program() {
    use acceptance_tests::rate::{allowed, outcome};
    use acceptance_tests::redis_provider::{connect, daily_policy, settings};
    use shared_contract::{AlgorithmKind, IncompatibleCategory, Readiness};
    let server = RedisServer::start();
    let p = daily_policy("acl", AlgorithmKind::FixedWindow, 1, 5);
    // Exactly what the provider and the programs use: no INFO, no CLIENT, no other keys.
    let [needed, _] = documented_acl_rules();
    acl_user(&server, "limiter", &needed);
    acl_user(
        &server,
        "notime",
        &without(&needed, &["+time", "+get", "+set"]),
    );
    acl_user(&server, "otherkeys", &on_other_keys(&needed));
    // The user and password in the URL, not in the settings' own fields.
    let as_url_user = |user: &str, pw: &str| RedisSettings {
        url: format!("redis://{user}:{pw}@127.0.0.1:{}/0", server.port()),
        ..settings(&server)
    };

    let limiter = connect(as_url_user("limiter", PASSWORD), vec![p.clone()]).await;
    assert!(
        allowed(&limiter, &p, subject(15)).await,
        "least privilege suffices"
    );
    assert_eq!(limiter.readiness().await, Readiness::Ready);

    for user in ["notime", "otherkeys"] {
        let provider = connect(as_url_user(user, PASSWORD), vec![p.clone()]).await;
        assert_eq!(
            outcome(&provider, &p, subject(16)).await,
            RateLimitOutcome::Incompatible {
                policy_id: p.id().clone(),
                category: IncompatibleCategory::Program,
            },
            "{user}"
        );
    }

    let mut wrong = as_url_user("limiter", "wrong-password");
    wrong.connect_timeout = Duration::from_millis(300);
    let provider = connect(wrong, vec![p.clone()]).await;
    assert!(matches!(
        outcome(&provider, &p, subject(17)).await,
        RateLimitOutcome::Unavailable {
            category: UnavailableCategory::Connect,
            ..
        }
    ));
    match provider.readiness().await {
        Readiness::NotReady(why) => assert!(!why.contains("wrong-password"), "{why}"),
        Readiness::Ready => panic!("ready with a wrong password"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_user_missing_xadd_is_refused_before_a_submission_can_write_half_an_event() {
    use shared_contract::IncompatibleCategory;
    use shared_contract::gate::{EventGatePort, GateOutcome};
    let [_, gate_rules] = documented_acl_rules();
    let server = RedisServer::start();
    acl_user(&server, "noxadd", &without(&gate_rules, &["+xadd"]));
    let g = gate_provider(as_user(&server, "noxadd")).await;
    let why = not_ready(EventGatePort::readiness(&g).await, "noxadd");
    for needle in [
        "may not run XADD on \"rl:*\" keys",
        "gate-submit-v1.lua",
        "gate-publish-v1.lua",
        "grant +xadd ~rl:*",
    ] {
        assert!(why.contains(needle), "{needle:?} not in {why}");
    }
    assert_eq!(
        submit(&g, "e1").await,
        GateOutcome::Incompatible {
            category: IncompatibleCategory::Program
        }
    );
    // Without the check this submission would have run INCR, ZADD and HSET before the refused
    // XADD, leaving an event that no stream entry announces.
    nothing_ran(&server, "noxadd");
}

// ---- The conformance suite over TLS, as the least-privilege user ---------------------------

/// One server for the whole suite: mutual TLS, and the documented least-privilege rate-limit
/// user (so every case also runs through the ACL rules it documents).
fn suite_settings() -> RedisSettings {
    static SERVER: OnceLock<(RedisServer, u16, PathBuf)> = OnceLock::new();
    let (_server, port, pki) = SERVER.get_or_init(|| {
        let pki = pki();
        let (server, port) = tls_server(&pki, "yes");
        acl_user(&server, "suite", &documented_acl_rules()[0]);
        (server, port, pki)
    });
    let mut s = tls_settings(
        *port,
        TlsFiles {
            ca_file: Some(pki.join("ca.crt")),
            cert_file: Some(pki.join("client.crt")),
            key_file: Some(pki.join("client.key")),
        },
    );
    s.username = Some("suite".to_owned());
    s.password = Some(PASSWORD.to_owned());
    s
}

/// One server for the whole suite over server-authenticated TLS (no client certificate), as
/// the default user.
fn server_auth_suite_settings() -> RedisSettings {
    static SERVER: OnceLock<(RedisServer, u16, PathBuf)> = OnceLock::new();
    let (_server, port, pki) = SERVER.get_or_init(|| {
        let pki = pki();
        let (server, port) = tls_server(&pki, "no");
        (server, port, pki)
    });
    tls_settings(
        *port,
        TlsFiles {
            ca_file: Some(pki.join("ca.crt")),
            cert_file: None,
            key_file: None,
        },
    )
}

mod server_auth_tls_conformance {
    use acceptance_tests::redis_target::RedisTarget;

    use super::server_auth_suite_settings;
    acceptance_tests::conformance_tests!(RedisTarget::new(server_auth_suite_settings));
    acceptance_tests::lease_conformance_tests!(RedisTarget::new(server_auth_suite_settings));
}

mod mutual_tls_least_privilege_conformance {
    use acceptance_tests::redis_target::RedisTarget;

    use super::suite_settings;
    acceptance_tests::conformance_tests!(RedisTarget::new(suite_settings));
}

/// What `docs/operations.md` says a concurrency policy adds to the rate-limit user's rules.
const LEASE_GRANTS: &[&str] = &[
    "+zremrangebyscore",
    "+zscore",
    "+zcard",
    "+zrange",
    "+zadd",
    "+pexpire",
    "+zrem",
];

#[test]
fn the_documented_lease_grants_are_the_ones_the_suite_grants() {
    let doc = include_str!("../../../docs/operations.md");
    let sentence = doc
        .split("A concurrency policy (leases) adds `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("operations.md documents the lease grants");
    let documented: Vec<&str> = sentence.split_whitespace().collect();
    assert_eq!(documented, LEASE_GRANTS);
}

/// One server for the lease suite: mutual TLS, and the documented least-privilege rate-limit
/// user with the documented lease grants.
fn lease_suite_settings() -> RedisSettings {
    static SERVER: OnceLock<(RedisServer, u16, PathBuf)> = OnceLock::new();
    let (_server, port, pki) = SERVER.get_or_init(|| {
        let pki = pki();
        let (server, port) = tls_server(&pki, "yes");
        let mut rules = documented_acl_rules()[0].clone();
        rules.extend(LEASE_GRANTS.iter().map(|g| (*g).to_owned()));
        acl_user(&server, "leases", &rules);
        (server, port, pki)
    });
    let mut s = tls_settings(
        *port,
        TlsFiles {
            ca_file: Some(pki.join("ca.crt")),
            cert_file: Some(pki.join("client.crt")),
            key_file: Some(pki.join("client.key")),
        },
    );
    s.username = Some("leases".to_owned());
    s.password = Some(PASSWORD.to_owned());
    s
}

mod mutual_tls_least_privilege_lease_conformance {
    use acceptance_tests::redis_target::RedisTarget;

    use super::lease_suite_settings;
    acceptance_tests::lease_conformance_tests!(RedisTarget::new(lease_suite_settings));
}
