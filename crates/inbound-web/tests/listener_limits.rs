//! End-to-end tests of the listener's `[http]` limits against the real binary: slowloris
//! connections under a lowered descriptor limit, the idle keep-alive timeout, the body limit
//! (413 problem+json, on every route: a limited route's quota is untouched) and its time
//! bound (408), and `max_connections`. Everything on 127.0.0.1, bounded in count and
//! time.

mod common;

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
    let app = App::start("[http]\nheader_read_timeout = \"1s\"\n", &[]);
    let limited = std::process::Command::new("prlimit")
        .args(["--pid", &app.pid().to_string(), "--nofile=64:64"])
        .status()
        .expect("run prlimit");
    assert!(limited.success(), "prlimit failed: {limited}");

    // 100 connections (more than the 64 descriptors) that send half a head and stall. Few
    // enough above the limit that the accept loop reaches it well within the 1 s timeout even
    // when it shares its cores with a build (a debug binary accepts a few hundred a second
    // then), and that an ordinary request queued behind them waits one timeout at most.
    let mut stalled = Vec::new();
    for _ in 0..100 {
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
    eprintln!("slowest ordinary request under 100 stalled connections: {slowest:?}");
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
