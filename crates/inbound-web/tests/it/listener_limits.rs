//! End-to-end tests of the listener's `[http]` limits against the real binary: slowloris
//! connections under a lowered descriptor limit, the idle keep-alive timeout, the body limit
//! (413 problem+json, on every route: a limited route's quota is untouched) and its time
//! bound (408), and `max_connections`. Everything on 127.0.0.1, bounded in count and
//! time.

use crate::common;

use std::time::{Duration, Instant};

use common::App;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";

/// Reads one response (head and `Content-Length` body) from `s` within `within`; `None`
/// when none came in time or the connection closed first.
async fn response(s: &mut TcpStream, within: Duration) -> Option<String> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    return Some(text);
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

/// Waits (at most `within`) for the peer to close `s`, reading and discarding what comes;
/// the time it took, or `None` when it stayed open.
async fn closed(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let drain = async {
        let mut chunk = [0u8; 1024];
        while let Ok(n) = s.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(within, drain)
        .await
        .ok()
        .map(|()| start.elapsed())
}

async fn connect(app: &App) -> TcpStream {
    TcpStream::connect(&app.addr).await.expect("connect")
}

#[tokio::test]
async fn slowloris_connections_are_closed_and_ordinary_requests_keep_being_answered() {
    // Two serving threads, whatever the machine: each runtime holds descriptors of its own
    // (about 16 are open at start with two), and the counts below are fitted to that.
    let app = App::start(
        "[http]\nheader_read_timeout = \"1s\"\nworker_threads = 2\n",
        &[],
    );
    let limited = std::process::Command::new("prlimit")
        .args(["--pid", &app.pid().to_string(), "--nofile=64:64"])
        .status()
        .expect("run prlimit");
    assert!(limited.success(), "prlimit failed: {limited}");

    // 90 connections (more than the 64 descriptors) that send half a head and stall. Few
    // enough above the limit that the accept loop reaches it well within the 1 s timeout even
    // when it shares its cores with a build (a debug binary accepts a few hundred a second
    // then), and that an ordinary request queued behind them waits one timeout at most (the
    // about 48 accepted first free room for the rest and the request when they time out).
    let mut stalled = Vec::new();
    for _ in 0..90 {
        let mut s = connect(&app).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
            .await
            .expect("write half a head");
        stalled.push(s);
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let mut slowest = Duration::ZERO;
    for i in 0..15 {
        let start = Instant::now();
        let r = client.get(app.url("/healthz")).send().await;
        let r = r.unwrap_or_else(|e| panic!("request {i} not answered within 2 s: {e}"));
        assert_eq!(r.status(), 200, "request {i}");
        slowest = slowest.max(start.elapsed());
        assert!(start.elapsed() < Duration::from_secs(2), "request {i}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("slowest ordinary request under 90 stalled connections: {slowest:?}");
    for (i, s) in stalled.iter_mut().enumerate() {
        assert!(
            closed(s, Duration::from_secs(5)).await.is_some(),
            "stalled connection {i} still open"
        );
    }
    let log = app.log();
    let lines = log.matches("accept failed").count();
    assert!(
        (1..=2).contains(&lines),
        "expected the out-of-descriptors failure logged once per interval, got {lines} lines:\n{log}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let app = App::start(
        "[http]\nidle_timeout = \"1s\"\nheader_read_timeout = \"30s\"\n",
        &[],
    );
    let mut s = connect(&app).await;
    s.write_all(HEALTHZ).await.expect("write");
    let r = response(&mut s, Duration::from_secs(5)).await;
    assert!(
        r.is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "first answer"
    );
    let after = closed(&mut s, Duration::from_secs(5)).await;
    let after = after.expect("idle connection still open after 5 s");
    assert!(
        after >= Duration::from_millis(900),
        "closed too early: {after:?}"
    );
    assert!(
        after <= Duration::from_secs(3),
        "closed too late: {after:?}"
    );
}

#[tokio::test]
async fn a_body_over_max_body_bytes_is_413_problem_json() {
    let client = reqwest::Client::new();
    let post = async |app: &App, n: usize| {
        let body = format!(r#"{{"policy":"api","subject":"{}"}}"#, "a".repeat(n));
        let r = client
            .post(app.url("/v1/evaluate"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");
        let ct = r.headers().get("content-type").cloned();
        (r.status().as_u16(), ct)
    };
    // The default limit (65,536 bytes), then a configured one: over it 413 problem+json,
    // under it not 413.
    for (config, over, under) in [
        ("", 70_000, 60_000),
        ("[http]\nmax_body_bytes = 100\n", 200, 10),
    ] {
        let app = App::start(config, &[]);
        let (status, ct) = post(&app, over).await;
        assert_eq!(status, 413, "{config:?}");
        assert_eq!(
            ct.as_ref().map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..])
        );
        let (status, _) = post(&app, under).await;
        assert_ne!(status, 413, "a body under the limit of {config:?}");
    }
}

#[tokio::test]
async fn connections_beyond_max_connections_wait_until_one_closes() {
    let app = App::start(
        "[http]\nmax_connections = 2\nheader_read_timeout = \"30s\"\nidle_timeout = \"30s\"\n",
        &[],
    );
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = connect(&app).await;
        s.write_all(HEALTHZ).await.expect("write");
        let r = response(&mut s, Duration::from_secs(5)).await;
        assert!(r.is_some(), "connection {i} within the cap is served");
        held.push(s);
    }
    let mut third = connect(&app).await;
    third.write_all(HEALTHZ).await.expect("write");
    assert!(
        response(&mut third, Duration::from_millis(700))
            .await
            .is_none(),
        "a third connection was served while two were open"
    );
    drop(held.remove(0));
    let r = response(&mut third, Duration::from_secs(3)).await;
    assert!(
        r.is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "the waiting connection is served once one closes"
    );
    assert!(app.log().contains("http.max_connections reached"));
}

/// One `/v1/evaluate` over a held HTTP/1.1 connection: the response, `None` when none came
/// within 1 s.
async fn evaluate_on(s: &mut TcpStream, subject: &str) -> Option<String> {
    let body = format!(r#"{{"policy":"api","subject":"{subject}","cost":1}}"#);
    let head = format!(
        "POST /v1/evaluate HTTP/1.1\r\nHost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(format!("{head}{body}").as_bytes()).await.ok()?;
    response(s, Duration::from_secs(1)).await
}

/// One `/v1/evaluate` on a new connection: the status, or why there was none.
async fn evaluate_fresh(client: &reqwest::Client, app: &App, subject: &str) -> Result<u16, String> {
    client
        .post(app.url("/v1/evaluate"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"policy":"api","subject":"{subject}","cost":1}}"#
        ))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

type RlsClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;

/// One RLS call for user `user`: whether it came back `OK` within 1 s.
async fn rls_allows(c: &mut RlsClient, user: &str) -> Result<(), String> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let answer = tokio::time::timeout(Duration::from_secs(1), c.should_rate_limit(request))
        .await
        .map_err(|_| "no answer within 1 s".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    match answer.into_inner().overall_code() {
        Code::Ok => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

async fn rls_client(addr: &str) -> Result<RlsClient, String> {
    tokio::time::timeout(
        Duration::from_secs(1),
        RlsClient::connect(format!("http://{addr}")),
    )
    .await
    .map_err(|_| "no connection within 1 s".to_owned())?
    .map_err(|e| format!("{e:?}"))
}

/// Round `round` of requests during an attack: one on a held and one on a new connection to
/// each port, each answered within 1 s (by Redis: the policy fails closed).
async fn answered_within_1_s(
    round: usize,
    app: &App,
    grpc: &str,
    held_http: &mut TcpStream,
    held_rls: &mut RlsClient,
    fresh_http: &reqwest::Client,
) {
    let who = format!("round-{round}");
    let r = evaluate_on(held_http, &who).await;
    assert!(
        r.as_deref().is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "round {round}: held HTTP connection: {r:?}"
    );
    rls_allows(held_rls, &who)
        .await
        .unwrap_or_else(|e| panic!("round {round}: held gRPC connection: {e}"));
    let status = evaluate_fresh(fresh_http, app, &who).await;
    assert_eq!(status, Ok(200), "round {round}: new HTTP connection");
    let mut fresh_rls = rls_client(grpc)
        .await
        .unwrap_or_else(|e| panic!("round {round}: new gRPC connection: {e}"));
    rls_allows(&mut fresh_rls, &who)
        .await
        .unwrap_or_else(|e| panic!("round {round}: new gRPC connection: {e}"));
}

/// Redis (failing closed), both ports with 2 s handshake timeouts, one policy for
/// `/v1/evaluate` and the descriptor `user`.
fn attack_config(redis_url: &str) -> String {
    format!(
        r#"{}
[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 100000
window = "1h"

[http]
header_read_timeout = "2s"

[grpc]
bind = "127.0.0.1:0"
handshake_timeout = "2s"

[[rls.descriptors]]
domain = "edge"
entries = ["user"]
policy = "api"
"#,
        common::redis_rate_limit(redis_url, "fail_closed", "")
    )
}

#[tokio::test]
async fn idle_connections_to_both_ports_under_a_low_descriptor_limit_starve_neither_port_nor_redis()
{
    let redis = acceptance_tests::redis_server::RedisServer::start();
    let config = attack_config(redis.url());
    // 256 descriptors, as in the report that stopped every listener with 300 idle
    // connections to the gRPC port.
    let app = App::start_limited(&config, &[], Some(256));
    let grpc = app.grpc_addr();
    // Clients that hold a connection (Envoy keeps one to its rate-limit service, HTTP clients
    // keep theirs alive), each used once before the attack.
    let mut held_http = connect(&app).await;
    let first = evaluate_on(&mut held_http, "before").await;
    assert!(first.is_some_and(|r| r.starts_with("HTTP/1.1 200")));
    let mut held_rls = rls_client(&grpc).await.expect("gRPC client");
    rls_allows(&mut held_rls, "before")
        .await
        .expect("gRPC before");

    // 300 connections to each port that send nothing, each watched until the server closes
    // it (the time from the attack's start, or `None` if still open after 10 s).
    let attacked = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(&grpc).await.expect("connect to gRPC"));
        idle.push(connect(&app).await);
    }
    let watchers: Vec<_> = idle
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                closed(&mut s, Duration::from_secs(10))
                    .await
                    .map(|_| attacked.elapsed())
            })
        })
        .collect();

    // For 4 s, held and new connections on both ports are answered within 1 s, by Redis.
    let fresh_http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    for round in 0..8 {
        answered_within_1_s(
            round,
            &app,
            &grpc,
            &mut held_http,
            &mut held_rls,
            &fresh_http,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Every idle connection was closed within the 2 s handshake timeout (plus slack for a
    // loaded machine): those the listeners took at their timeouts, the others at once, to
    // make room for the next client.
    let mut latest = Duration::ZERO;
    for (i, w) in watchers.into_iter().enumerate() {
        let at = w.await.expect("watcher");
        let at =
            at.unwrap_or_else(|| panic!("idle connection {i} still open 10 s after the attack"));
        latest = latest.max(at);
    }
    eprintln!("the last idle connection was closed {latest:?} after the attack began");
    assert!(
        latest < Duration::from_secs(4),
        "the last idle connection was closed {latest:?} after the attack began"
    );
    // A Redis reconnect finds a descriptor: the app's connections are killed on the server,
    // and evaluations are answered by Redis again.
    let mut admin = redis.connection();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .expect("CLIENT KILL");
    acceptance_tests::eventually::eventually(
        "evaluations answered by Redis again after its connections were killed",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || match evaluate_fresh(&fresh_http, &app, "after").await {
            Ok(200) => Ok(()),
            other => Err(other),
        },
    )
    .await;
    let log = app.log();
    assert!(
        !log.contains("accept failed") && !log.contains("Too many open files"),
        "a listener or Redis ran out of descriptors:\n{log}"
    );
    assert!(log.contains("serving fewer connections"), "{log}");
    assert!(log.contains("grpc.max_connections reached"), "{log}");
    assert!(log.contains("http.max_connections reached"), "{log}");
}

/// A limited route (`/api`, 2 requests per hour per `x-api-key`) and a small body limit.
const LIMITED: &str = r#"
[http]
max_body_bytes = 1000
header_read_timeout = "1s"

[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 2
window = "1h"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"
"#;

/// The status of a response's head, `0` for none.
fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Asserts that `key` still has its whole quota of 2 on `/api`: two requests pass, the
/// third is denied.
async fn quota_untouched(app: &App, key: &str) {
    let client = reqwest::Client::new();
    for expected in [200, 200, 429] {
        let r = client
            .get(app.url("/api/x"))
            .header("x-api-key", key)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), expected, "quota of {key}");
    }
}

#[tokio::test]
async fn a_body_over_max_body_bytes_on_a_limited_route_is_413_and_charges_nothing() {
    let app = App::start(LIMITED, &[]);
    let client = reqwest::Client::new();
    // 10 MB with its Content-Length: refused from the head, before the rate limiter.
    let r = client
        .post(app.url("/api/x"))
        .header("x-api-key", "big")
        .body(vec![b'a'; 10 * 1024 * 1024])
        .send()
        .await;
    // The server may close the connection while the client still sends; an answer, when the
    // client read one, is the 413.
    if let Ok(r) = r {
        assert_eq!(r.status().as_u16(), 413);
        assert_eq!(
            r.headers().get("content-type").map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..])
        );
        let v: serde_json::Value = r.json().await.expect("problem+json");
        assert_eq!(v["error"], "content_too_large", "{v}");
    }
    quota_untouched(&app, "big").await;

    // Chunked, no Content-Length: 1,500 bytes in three chunks, over the limit of 1,000 only
    // once read. Never a 200: 413, or the connection closed.
    let mut s = connect(&app).await;
    s.write_all(
        b"POST /api/x HTTP/1.1\r\nHost: t\r\nx-api-key: chunked\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .expect("write head");
    for _ in 0..3 {
        let chunk = format!("1f4\r\n{}\r\n", "b".repeat(500));
        if s.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    if let Some(head) = response(&mut s, Duration::from_secs(2)).await {
        assert_eq!(status_of(&head), 413, "{head}");
    }
    quota_untouched(&app, "chunked").await;
}

#[tokio::test]
async fn a_content_length_of_10_gb_with_one_byte_sent_is_413_at_once() {
    let app = App::start(LIMITED, &[]);
    for (path, key) in [("/api/x", "huge"), ("/v1/evaluate", "-")] {
        let mut s = connect(&app).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nx-api-key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{"
        );
        s.write_all(head.as_bytes()).await.expect("write");
        let start = Instant::now();
        let answer = response(&mut s, Duration::from_secs(1)).await;
        let head = answer.unwrap_or_else(|| panic!("{path}: no answer within 1 s"));
        assert_eq!(status_of(&head), 413, "{path}: {head}");
        assert!(head.contains("application/problem+json"), "{path}: {head}");
        assert!(start.elapsed() < Duration::from_secs(1));
    }
    quota_untouched(&app, "huge").await;
}

#[tokio::test]
async fn a_body_that_stalls_is_answered_408_after_header_read_timeout_and_charges_nothing() {
    // `header_read_timeout` is 1 s: the body must be complete 1 s after the head.
    let app = App::start(LIMITED, &[]);
    let stalled = [
        ("/api/x", "Content-Length: 100\r\n\r\n0123456789".to_owned()),
        (
            "/api/x",
            "Transfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n".to_owned(),
        ),
        (
            "/v1/evaluate",
            r#"Content-Length: 100\r\n\r\n{"policy":"api","#.replace("\\r\\n", "\r\n"),
        ),
    ];
    for (path, rest) in stalled {
        let mut s = connect(&app).await;
        let request = format!("POST {path} HTTP/1.1\r\nHost: t\r\nx-api-key: slow\r\n{rest}");
        s.write_all(request.as_bytes()).await.expect("write");
        let start = Instant::now();
        let head = response(&mut s, Duration::from_secs(3))
            .await
            .unwrap_or_else(|| panic!("{path} {rest:?}: no answer within 3 s"));
        assert_eq!(status_of(&head), 408, "{path} {rest:?}: {head}");
        assert!(
            start.elapsed() >= Duration::from_millis(900),
            "{path}: answered before the bound: {:?}",
            start.elapsed()
        );
    }
    quota_untouched(&app, "slow").await;
}
