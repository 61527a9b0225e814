//! Fuzzing STOMP frame parsing on the gate stream (`v12.stomp`), through the WebSocket: the
//! gate routes served in process on a loopback listener, each case one connection sending a
//! few frames (often a valid handshake first, then commands, headers and bodies of any
//! shape), then closing. No server task panics; every frame the server sends is a
//! `CONNECTED`, `ERROR`, `RECEIPT` or `MESSAGE` frame with one NUL, at its end, and an
//! `ERROR` stays short whatever it answers.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use inbound_web::gates::GateApi;
use proptest::prelude::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

/// Panics on the server's threads since it started. Only those: the other tests of this
/// binary share the process (and `should_panic` tests panic on purpose).
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// The name of every thread of the server's runtime, by which the panic hook knows them.
const SERVER_THREAD: &str = "fuzz-stomp-server";

struct Server {
    runtime: tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
}

fn server() -> &'static Server {
    static SERVER: std::sync::OnceLock<Server> = std::sync::OnceLock::new();
    SERVER.get_or_init(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(SERVER_THREAD) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default_hook(info);
        }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(SERVER_THREAD)
            .enable_all()
            .build()
            .expect("a runtime");
        let addr = runtime.block_on(async {
            let settings = app_bootstrap::config::from_toml(
                "[event_gates.orders]\nmode = \"only_once\"\nduration = \"1h\"\n",
            )
            .expect("valid");
            let gates = app_bootstrap::build_gates(&settings)
                .await
                .expect("built")
                .expect("a gate");
            let router = inbound_web::gates::router(Arc::new(GateApi::new(Some(Arc::new(gates)))));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            });
            addr
        });
        Server { runtime, addr }
    })
}

/// One of `words`.
fn words(words: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(words).prop_map(str::to_owned)
}

/// One STOMP-ish frame: a command, headers, a body, each sometimes malformed.
fn frame() -> impl Strategy<Value = String> {
    let command = prop_oneof![
        words(&[
            "CONNECT",
            "STOMP",
            "SUBSCRIBE",
            "DISCONNECT",
            "SEND",
            "ACK",
            "UNSUBSCRIBE",
            "",
            " CONNECT ",
            "connect",
        ]),
        any::<String>(),
        (0usize..3000).prop_map(|n| "X".repeat(n)),
    ];
    let name = prop_oneof![
        words(&[
            "accept-version",
            "host",
            "id",
            "destination",
            "receipt",
            "content-length",
            "heart-beat",
            "",
        ]),
        "[a-z:\\\\-]{1,12}",
    ];
    let value = prop_oneof![
        words(&[
            "1.2",
            "1.0,1.1",
            "1.1, 1.2",
            "/topic/gates/orders",
            "/topic/gates/other",
            "sub-0",
            "r-1",
            "",
            "0",
            "-1",
            "99999999999999999999",
        ]),
        (0usize..400).prop_map(|n| "v".repeat(n)),
        any::<String>(),
    ];
    (
        prop::sample::select(vec!["", "\n", "\r\n", "\n\n"]),
        command,
        prop::collection::vec((name, value), 0..5),
        prop::sample::select(vec!["\n", "\r\n"]),
        prop_oneof![Just(String::new()), any::<String>()],
        prop::sample::select(vec!["\0", "", "\0\0", "\0junk"]),
    )
        .prop_map(|(lead, command, headers, eol, body, end)| {
            let mut f = format!("{lead}{command}{eol}");
            for (k, v) in headers {
                f.push_str(&format!("{k}:{v}{eol}"));
            }
            f.push_str(&format!("{eol}{body}{end}"));
            f
        })
}

/// The frames of one connection: often a valid CONNECT (and SUBSCRIBE) first.
fn session() -> impl Strategy<Value = Vec<String>> {
    (0u8..3, prop::collection::vec(frame(), 0..4)).prop_map(|(valid, mut frames)| {
        let mut start = Vec::new();
        if valid >= 1 {
            start.push("CONNECT\naccept-version:1.2\nhost:gates\n\n\0".to_owned());
        }
        if valid >= 2 {
            start.push("SUBSCRIBE\nid:sub-0\ndestination:/topic/gates/orders\n\n\0".to_owned());
        }
        start.append(&mut frames);
        start
    })
}

/// Sends `frames`, closes, and returns the text frames the server sent until it closed.
async fn exchange(addr: std::net::SocketAddr, frames: Vec<String>) -> Vec<String> {
    let mut req = format!("ws://{addr}/v1/gates/orders/stream")
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v12.stomp".parse().expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    for f in frames {
        if ws.send(Message::text(f)).await.is_err() {
            break;
        }
    }
    let _ = ws.send(Message::Close(None)).await;
    let mut received = Vec::new();
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Text(t) = m {
            received.push(t.as_str().to_owned());
        }
    }
    received
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn stomp_frames_of_any_shape_get_well_formed_answers(frames in session()) {
        let server = server();
        let sent: usize = frames.iter().map(String::len).sum();
        let addr = server.addr;
        let handshake = frames.first().is_some_and(|f| f.starts_with("CONNECT\naccept-version:1.2\n"));
        let received = server
            .runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), exchange(addr, frames)).await
            })
            .map_err(|_| TestCaseError::fail("no end of the exchange within 20 s"))?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a server task panicked");
        if handshake {
            prop_assert!(received.first().is_some_and(|f| f.starts_with("CONNECTED\n")), "{:?}", received);
        }
        for text in received {
            let command = text.split('\n').next().unwrap_or_default();
            prop_assert!(
                ["CONNECTED", "ERROR", "RECEIPT", "MESSAGE"].contains(&command),
                "{:?}", text
            );
            prop_assert_eq!(text.find('\0'), Some(text.len() - 1), "{:?}", text);
            if command == "ERROR" {
                prop_assert!(text.len() < 1024, "a {}-byte ERROR for {} bytes sent", text.len(), sent);
            }
        }
    }
}
