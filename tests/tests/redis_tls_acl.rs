//! The Redis provider over TLS (server-auth and mutual) and as a least-privilege ACL user,
//! on servers the harness starts. Certificates come from `openssl` into a temp dir.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{RedisProvider, RedisSettings, TlsFiles};
use shared_contract::{
    AlgorithmSpec, Cost, Deadline, EdgeRateLimitPort, FailurePolicy, PolicyId, PolicyRevision,
    PolicySet, PolicySpec, RateLimitOutcome, RateLimitPolicy, RateLimitRequest, SubjectDigest,
    UnavailableCategory,
};

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("api").expect("id"),
        revision: PolicyRevision::new(1).expect("revision"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: 2,
            window: Duration::from_secs(86_400),
        },
        max_cost: 1,
        cleanup_grace: Duration::from_secs(60),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("policy")
}

fn request(tag: u8) -> RateLimitRequest {
    RateLimitRequest {
        policy_id: PolicyId::new("api").expect("id"),
        subject: SubjectDigest::from_bytes([tag; 32]),
        cost: Cost::ONE,
        evaluation_id: None,
        deadline: Deadline::within(Duration::from_secs(10)).expect("deadline"),
    }
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
fn pki() -> PathBuf {
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
    let policies = PolicySet::new(vec![policy()], PolicyId::new("api").expect("id")).expect("set");
    RedisProvider::connect(settings, policies)
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
        let policies =
            PolicySet::new(vec![policy()], PolicyId::new("api").expect("id")).expect("set");
        let err = rt
            .block_on(RedisProvider::connect(s, policies))
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
    let server = RedisServer::start_with(&[
        "--user",
        "limiter",
        "on",
        ">s3cret-pass",
        "~rl:*",
        "+evalsha",
        "+eval",
        "+script|load",
        "+ping",
        "+time",
        "+get",
        "+set",
    ]);
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
