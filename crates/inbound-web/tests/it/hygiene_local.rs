//! End-to-end tests of protocol hygiene on the real binary with the local provider: STOMP
//! ERROR frames stay small and well formed whatever the client sent, STOMP 1.0 clients are
//! refused, the middleware bounds subjects as `/v1/evaluate` does, and every error the app
//! answers is problem+json, with the exact limits beyond which hyper answers by itself.

use crate::common;

use std::time::Duration;

use common::{App, Ws};
use futures::SinkExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const CONFIG: &str = r#"
[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 5
window = "1h"

[rate_limit.policies.users]
algorithm = "fixed_window"
limit = 5
window = "1h"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"

[[routes]]
path_prefix = "/api"
policy = "users"
subject = "header:x-user"

[event_gates.once]
mode = "only_once"
duration = "600ms"
"#;

/// A STOMP connection to the `once` gate's stream.
async fn stomp(app: &App) -> Ws {
    let mut req = format!("ws://{}/v1/gates/once/stream", app.addr)
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v12.stomp".parse().expect("header"),
    );
    tokio_tungstenite::connect_async(req)
        .await
        .expect("connect")
        .0
}

/// A frame the server sent, checked to be one well-formed STOMP frame: one NUL, at its end;
/// `name:value` header lines; a `content-length` equal to the body's, when given.
struct Frame {
    text: String,
    command: String,
    headers: Vec<(String, String)>,
}

impl Frame {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn frame(ws: &mut Ws) -> Frame {
    let text = common::ws_message(ws)
        .await
        .into_text()
        .expect("a text frame")
        .as_str()
        .to_owned();
    assert_eq!(text.find('\0'), Some(text.len() - 1), "one NUL, at the end");
    let (head, body) = text[..text.len() - 1]
        .split_once("\n\n")
        .expect("a blank line ends the headers");
    let mut lines = head.lines();
    let command = lines.next().expect("a command").to_owned();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("header line {l:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let f = Frame {
        text: text.clone(),
        command,
        headers,
    };
    if let Some(len) = f.header("content-length") {
        assert_eq!(len.parse::<usize>().expect("a length"), body.len());
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_kb_junk_command_gets_a_small_well_formed_error_frame() {
    let app = App::start(CONFIG, &[]);
    let mut ws = stomp(&app).await;
    let junk = format!("{}\0{}\n\n\0", "X".repeat(50_000), "Y".repeat(50_000));
    ws.send(Message::text(junk)).await.expect("send");
    let f = frame(&mut ws).await;
    assert_eq!(f.command, "ERROR");
    assert!(f.text.len() < 1024, "{} bytes", f.text.len());
    let message = f.header("message").expect("a message header");
    assert!(message.starts_with("unexpected \"XXXX"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_without_accept_version_is_stomp_1_0_and_refused() {
    let app = App::start(CONFIG, &[]);
    let mut ws = stomp(&app).await;
    ws.send(Message::text("CONNECT\nhost:gates\n\n\0"))
        .await
        .expect("send");
    let f = frame(&mut ws).await;
    assert_eq!(f.command, "ERROR", "{}", f.text);
    assert_eq!(
        f.header("version"),
        Some("1.2"),
        "the versions the server supports"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_id_the_server_would_repeat_is_bounded() {
    let app = App::start(CONFIG, &[]);
    let mut ws = stomp(&app).await;
    ws.send(Message::text("CONNECT\naccept-version:1.2\n\n\0"))
        .await
        .expect("send");
    assert_eq!(frame(&mut ws).await.command, "CONNECTED");
    let id = "i".repeat(10_000);
    ws.send(Message::text(format!(
        "SUBSCRIBE\nid:{id}\ndestination:/topic/gates/once\n\n\0"
    )))
    .await
    .expect("send");
    let f = frame(&mut ws).await;
    assert_eq!(f.command, "ERROR");
    assert!(f.text.len() < 1024, "{} bytes", f.text.len());
}

/// A raw HTTP/1.1 exchange: what the server answered to `request`.
struct Raw {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The problem+json body, checked to carry this status.
    fn problem(&self) -> serde_json::Value {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.head
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body).expect("problem JSON");
        assert_eq!(v["status"], self.status, "{v}");
        assert_eq!(v["type"], "about:blank", "{v}");
        assert!(v["title"].is_string() && v["error"].is_string(), "{v}");
        v
    }
}

impl Raw {
    /// The response in `got`, if its head is complete; `whole` when the body is too (by its
    /// `content-length`).
    fn parse(got: &[u8]) -> Option<(Raw, bool)> {
        let end = got.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        let r = Raw {
            status: head.get(9..12)?.parse().ok()?,
            head,
            body: got[end + 4..].to_vec(),
        };
        let len: Option<usize> = r.header("content-length").and_then(|l| l.parse().ok());
        let whole = len.is_some_and(|l| r.body.len() >= l);
        Some((r, whole))
    }
}

/// Sends `request` as is and reads one response (up to its `content-length`, or to the end).
async fn raw(app: &App, request: &[u8]) -> Raw {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(&app.addr)
            .await
            .expect("connect");
        // A server that answers before the whole request arrived (413 on a body over the
        // limit) may close its side while this is still writing: the answer is then already
        // on its way, so a failed write is not the test's failure; reading decides.
        let _ = s.write_all(request).await;
        let mut got = Vec::new();
        let mut buf = vec![0; 64 * 1024];
        loop {
            if let Some((r, true)) = Raw::parse(&got) {
                return r;
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        Raw::parse(&got).expect("a response head").0
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer within 10 s")
}

fn get(target: &str, headers: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n{headers}\r\n")
        .into_bytes()
}

#[tokio::test]
async fn the_middleware_bounds_subjects_as_evaluate_does_and_charges_nothing_beyond() {
    let app = App::start(CONFIG, &[]);
    let user = |len: usize| format!("x-api-key: k\r\nx-user: {}\r\n", "u".repeat(len));
    let r = raw(&app, &get("/api/x", &user(257))).await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(r.problem()["error"], "subject_too_long");
    assert!(r.header("ratelimit").is_none());
    // Past the app's header bound, the head itself is refused first.
    let r = raw(&app, &get("/api/x", &user(100_000))).await;
    assert_eq!(r.status, 431, "{}", r.head);
    r.problem();
    let r = raw(&app, &get("/api/x", &user(256))).await;
    assert_eq!(r.status, 200, "256 bytes is the bound: {}", r.head);
    let limit = r.header("ratelimit").expect("RateLimit");
    assert!(
        limit.starts_with("\"api\";r=4;"),
        "neither refusal charged api: {limit}"
    );
}

#[tokio::test]
async fn a_method_the_route_does_not_serve_is_405_problem_json_with_allow() {
    let app = App::start(CONFIG, &[]);
    let r = raw(
        &app,
        b"DELETE /v1/evaluate HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 405, "{}", r.head);
    assert_eq!(r.problem()["error"], "method_not_allowed");
    assert!(
        r.header("allow").is_some_and(|a| a.contains("POST")),
        "{}",
        r.head
    );
}

#[tokio::test]
async fn a_path_parameter_that_is_not_utf_8_is_400_problem_json() {
    let app = App::start(CONFIG, &[]);
    let r = raw(&app, &get("/v1/gates/%FF/snapshot", "")).await;
    assert_eq!(r.status, 400, "{}", r.head);
    r.problem();
}

#[tokio::test]
async fn the_stream_route_without_an_upgrade_is_426_problem_json() {
    let app = App::start(CONFIG, &[]);
    let r = raw(&app, &get("/v1/gates/once/stream", "")).await;
    assert_eq!(r.status, 426, "{}", r.head);
    assert_eq!(r.problem()["error"], "websocket_required");
    assert_eq!(r.header("upgrade"), Some("websocket"));
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_problem_json() {
    let app = App::start(CONFIG, &[]);
    // Over axum's 2 MiB limit, sent chunked without an end, so that the server has read all
    // of it when it answers.
    let chunk = vec![b' '; 2 * 1024 * 1024 + 1];
    let mut request = b"POST /v1/evaluate HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
    request.extend_from_slice(&chunk);
    request.extend_from_slice(b"\r\n");
    let r = raw(&app, &request).await;
    assert_eq!(r.status, 413, "{}", r.head);
    assert_eq!(r.problem()["title"], "Content Too Large");
}

#[tokio::test]
async fn a_head_over_the_apps_bounds_is_414_or_431_problem_json() {
    let app = App::start(CONFIG, &[]);
    let r = raw(&app, &get(&format!("/api/{}", "a".repeat(9_000)), "")).await;
    assert_eq!(r.status, 414, "{}", r.head);
    r.problem();
    let big = (0..5)
        .map(|i| format!("x-big-{i}: {}\r\n", "b".repeat(8 * 1024)))
        .collect::<String>();
    let r = raw(&app, &get("/healthz", &big)).await;
    assert_eq!(r.status, 431, "{}", r.head);
    r.problem();
}

#[tokio::test]
async fn hyper_answers_itself_with_an_empty_body_beyond_its_own_bounds() {
    // These never reach the app: hyper's HTTP/1 parser refuses them and writes the status
    // line alone. Its bounds lie above the app's (8 KiB target, 32 KiB of headers).
    let app = App::start(CONFIG, &[]);
    let target = format!("/{}", "a".repeat(65_534));
    let r = raw(&app, &get(&target, "")).await;
    assert_eq!((r.status, r.body.len()), (414, 0), "{}", r.head);
    let many = (0..101)
        .map(|i| format!("x-h{i}: v\r\n"))
        .collect::<String>();
    let r = raw(&app, &get("/healthz", &many)).await;
    assert_eq!((r.status, r.body.len()), (431, 0), "{}", r.head);
    let r = raw(&app, &get("/healthz", "not a header line\r\n")).await;
    assert_eq!((r.status, r.body.len()), (400, 0), "{}", r.head);
    assert!(r.header("content-type").is_none());
}
