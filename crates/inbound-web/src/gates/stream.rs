//! `GET /v1/gates/{gate}/stream`: a WebSocket of JSON text frames that lets a subscriber keep
//! a copy of the gate ([`shared_contract::gate::Replica`]).
//!
//! Frames, in clock order: first `{"type":"snapshot","clock","incubating"}`, then one
//! `{"type":"status","id","key","status","clock","at_ms","publish_at_ms"}` per update,
//! pulled with `updates_after(cursor)`; a fresh snapshot every [`SNAPSHOT_INTERVAL`] and
//! whenever the provider answers `Resync` (the updates after the cursor are gone). The stream
//! is lossless ([`shared_contract::gate::Feed`]): a periodic snapshot comes after every update
//! up to its clock, and after a resync the terminal status of each event the subscriber held
//! comes before the fresh snapshot.
//!
//! Bounds: at most [`MAX_SUBSCRIBERS_PER_GATE`] subscribers per gate and [`MAX_SUBSCRIBERS`]
//! in total (beyond either the upgrade is refused with 503 problem+json); the server pings
//! every [`PING_INTERVAL`] and closes a peer it heard nothing from (not even a pong) for
//! [`IDLE_TIMEOUT`] with code [`CLOSE_IDLE`] (1001).
//!
//! A client that asks for the `v12.stomp` subprotocol gets the same frames as bodies of
//! STOMP 1.2 `MESSAGE` frames after `CONNECT` and `SUBSCRIBE` to `/topic/gates/{gate}`
//! ([`STOMP_PROTOCOL`], `serve_stomp`). Only STOMP 1.2 is spoken: a `CONNECT` without
//! `accept-version` is a STOMP 1.0 client and is answered `ERROR` (`version:1.2`). An `ERROR`
//! frame repeats at most 64 characters of what the client sent, quoted and with control
//! characters escaped, so it stays small and well formed whatever arrived; subscription and
//! receipt ids, which the server repeats in its frames, are at most 256 bytes.
//!
//! The key design decision: **a subscriber can only slow itself down.** Each connection pulls
//! from the provider with its own cursor, so a slow one never holds the gate or the other
//! subscribers back; and a frame the socket does not accept within [`SEND_TIMEOUT`] closes
//! the connection with code 1008 and the reason `slow subscriber: ...`, instead of buffering
//! without bound. The subscriber reconnects and starts again from a snapshot.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use app_bootstrap::GateRuntime;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::problem;
use futures::stream::SplitSink;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use shared_contract::gate::{Feed, FeedTiming, Frame, GateId, Step};

pub use crate::gates::subscribers::{MAX_SUBSCRIBERS, MAX_SUBSCRIBERS_PER_GATE, Subscribers};
use crate::gates::{GateApi, snapshot_json, status_json};

/// How often a subscriber gets a fresh snapshot without asking.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(5);
/// How often the server pings the peer.
pub const PING_INTERVAL: Duration = Duration::from_secs(15);
/// A peer from which nothing (no pong, no frame) arrived for this long is closed as dead.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// Close code for an idle (dead) peer (1001, going away).
pub const CLOSE_IDLE: u16 = 1001;
/// How long one frame may wait for the socket before the subscriber is closed as slow.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Close code for a slow subscriber (1008, policy violation).
pub const CLOSE_SLOW: u16 = 1008;
/// Most updates pulled per call.
const BATCH: usize = 256;
/// Longest wait of one pull (bounded so that the periodic snapshot is on time).
const PULL_WAIT: Duration = Duration::from_millis(500);

pub(crate) async fn stream(
    State(api): State<Arc<GateApi>>,
    Path(gate): Path<String>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let (rt, gate) = match api.resolve(&gate) {
        Ok((rt, gate)) => (rt.clone(), gate),
        Err(r) => return *r,
    };
    let ws = match ws {
        Ok(ws) => ws.protocols([STOMP_PROTOCOL]),
        Err(rejection) => return not_an_upgrade(&rejection),
    };
    let Some(permit) = api.subscribers().admit(&gate) else {
        return too_many_subscribers(&gate);
    };
    let stomp = ws.selected_protocol().is_some();
    ws.on_upgrade(move |socket| async move {
        let _permit = permit;
        if stomp {
            serve_stomp(socket, rt, gate).await;
        } else {
            serve(socket, Framing::Json, rt, gate).await;
        }
    })
}

/// The problem+json answer to a request of the stream route that is not a WebSocket handshake.
/// A request without `Upgrade: websocket` / `Connection: upgrade`, or of another WebSocket
/// version, is 426 with `Upgrade: websocket` (RFC 9110 section 15.5.22) and, for a version,
/// `Sec-WebSocket-Version: 13` (RFC 6455 section 4.4); other failures keep axum's status.
fn not_an_upgrade(rejection: &WebSocketUpgradeRejection) -> Response {
    let (status, version) = match rejection {
        WebSocketUpgradeRejection::InvalidConnectionHeader(_)
        | WebSocketUpgradeRejection::InvalidUpgradeHeader(_) => {
            (StatusCode::UPGRADE_REQUIRED, false)
        }
        WebSocketUpgradeRejection::InvalidWebSocketVersionHeader(_) => {
            (StatusCode::UPGRADE_REQUIRED, true)
        }
        other => (other.status(), false),
    };
    let detail = format!(
        "this route is a WebSocket stream: {}",
        rejection.body_text().to_lowercase()
    );
    let mut response = problem::about_blank(status, Some("websocket_required"), Some(&detail));
    let headers = response.headers_mut();
    if status == StatusCode::UPGRADE_REQUIRED {
        // Upgrade is hop-by-hop: it is named in Connection too (RFC 9110 section 7.8).
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if version {
        headers.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
    }
    response
}

/// The 503 answer when the gate or the process has its most subscribers.
fn too_many_subscribers(gate: &GateId) -> Response {
    let detail = format!(
        "gate {gate} has {MAX_SUBSCRIBERS_PER_GATE} subscribers or the server \
         {MAX_SUBSCRIBERS}: try again later"
    );
    let mut response = problem::about_blank(
        StatusCode::SERVICE_UNAVAILABLE,
        Some("too_many_subscribers"),
        Some(&detail),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// How each JSON frame goes on the wire.
enum Framing {
    /// The JSON text itself.
    Json,
    /// A STOMP 1.2 `MESSAGE` frame of the subscription, the JSON as its body.
    Stomp {
        subscription: String,
        destination: String,
        next_id: u64,
    },
}

impl Framing {
    fn wrap(&mut self, frame: &Value) -> String {
        match self {
            Framing::Json => frame.to_string(),
            Framing::Stomp {
                subscription,
                destination,
                next_id,
            } => {
                *next_id += 1;
                let body = frame.to_string();
                format!(
                    "MESSAGE\nsubscription:{}\nmessage-id:{next_id}\ndestination:{}\ncontent-type:application/json\ncontent-length:{}\n\n{body}\0",
                    stomp_escape(subscription),
                    stomp_escape(destination),
                    body.len()
                )
            }
        }
    }
}

/// Why a connection ended.
enum End {
    /// The peer closed or the socket failed: nothing more to send.
    Gone,
    /// Close with this code and reason.
    Close(u16, String),
}

type Sink = SplitSink<WebSocket, Message>;

async fn send(sink: &mut Sink, framing: &mut Framing, frame: &Value) -> Result<(), End> {
    send_message(sink, Message::Text(framing.wrap(frame).into())).await
}

async fn send_message(sink: &mut Sink, message: Message) -> Result<(), End> {
    match tokio::time::timeout(SEND_TIMEOUT, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(End::Gone),
        Err(_) => Err(End::Close(
            CLOSE_SLOW,
            format!(
                "slow subscriber: a frame was not accepted within {} ms",
                SEND_TIMEOUT.as_millis()
            ),
        )),
    }
}

async fn serve(socket: WebSocket, mut framing: Framing, rt: Arc<GateRuntime>, gate: GateId) {
    let stomp = matches!(framing, Framing::Stomp { .. });
    let (mut sink, mut incoming) = socket.split();
    let peer = Arc::new(Peer::new());
    let heard = peer.clone();
    // The reader notices the peer going away (axum answers pings itself) and, under STOMP,
    // a DISCONNECT, whose receipt id it hands back.
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<Option<String>>();
    let reader = tokio::spawn(async move {
        let mut receipt = None;
        while let Some(m) = incoming.next().await {
            heard.heard();
            match m {
                Err(_) | Ok(Message::Close(_)) => break,
                Ok(Message::Text(t)) if stomp => {
                    if let Some(f) = StompFrame::parse(t.as_str())
                        && f.command == "DISCONNECT"
                    {
                        receipt = Some(f.header("receipt").unwrap_or_default().to_owned());
                        break;
                    }
                }
                Ok(_) => {}
            }
        }
        let _ = gone_tx.send(receipt);
    });
    let end = tokio::select! {
        end = pump(&mut sink, &mut framing, &rt, &gate, &peer) => end,
        r = &mut gone => match r {
            Ok(Some(receipt)) => {
                if let Some(frame) = receipt_for(&receipt) {
                    let _ = tokio::time::timeout(SEND_TIMEOUT, sink.send(frame)).await;
                }
                End::Close(1000, "disconnected".to_owned())
            }
            _ => End::Gone,
        },
    };
    if let End::Close(code, reason) = end {
        tracing::info!(gate = %gate, code, reason = %reason, "closing gate stream");
        let frame = Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }));
        let _ = tokio::time::timeout(SEND_TIMEOUT, sink.send(frame)).await;
    }
    reader.abort();
}

/// The JSON frame of one feed frame.
fn frame_json(frame: &Frame) -> Value {
    match frame {
        Frame::Snapshot(s) => {
            let mut json = snapshot_json(s);
            json["type"] = "snapshot".into();
            json
        }
        Frame::Status(u) => status_json(u),
    }
}

async fn pump(
    sink: &mut Sink,
    framing: &mut Framing,
    rt: &GateRuntime,
    gate: &GateId,
    peer: &Peer,
) -> End {
    match pump_inner(sink, framing, rt, gate, peer).await {
        Ok(never) => match never {},
        Err(end) => end,
    }
}

/// Sends what the gate's [`Feed`] hands out (lossless: see its documentation), pings the
/// peer every [`PING_INTERVAL`] and closes an idle one.
async fn pump_inner(
    sink: &mut Sink,
    framing: &mut Framing,
    rt: &GateRuntime,
    gate: &GateId,
    peer: &Peer,
) -> Result<std::convert::Infallible, End> {
    let max = NonZeroUsize::new(BATCH).unwrap_or(NonZeroUsize::MIN);
    let timing = FeedTiming {
        snapshot_interval: SNAPSHOT_INTERVAL,
        budget: rt.budget(),
        pull_wait: PULL_WAIT,
    };
    let mut feed = Feed::new(gate.clone(), max, timing);
    let mut next_ping = PING_INTERVAL;
    loop {
        let now = peer.since_start();
        if now >= next_ping {
            if now.saturating_sub(peer.last_heard()) >= IDLE_TIMEOUT {
                return Err(End::Close(
                    CLOSE_IDLE,
                    format!(
                        "idle peer: nothing received within {} s",
                        IDLE_TIMEOUT.as_secs()
                    ),
                ));
            }
            next_ping = now + PING_INTERVAL;
            send_message(sink, Message::Ping(Vec::new().into())).await?;
        }
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        match feed.step(rt.port().as_ref(), now_ms).await {
            Ok(Step::Send(frames)) => {
                for f in &frames {
                    send(sink, framing, &frame_json(f)).await?;
                }
            }
            Ok(Step::Wait(wait)) => tokio::time::sleep(wait).await,
            Err(e) => return Err(End::Close(1011, e.to_string())),
        }
    }
}

/// When the peer was last heard from (any frame, a pong included).
struct Peer {
    start: Instant,
    last_heard_ms: AtomicU64,
}

impl Peer {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_heard_ms: AtomicU64::new(0),
        }
    }

    fn since_start(&self) -> Duration {
        self.start.elapsed()
    }

    fn heard(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_heard_ms.store(ms, Ordering::Relaxed);
    }

    fn last_heard(&self) -> Duration {
        Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed))
    }
}

/// The WebSocket subprotocol name of STOMP 1.2 (the "STOMP over WebSocket" convention).
pub const STOMP_PROTOCOL: &str = "v12.stomp";

/// One received STOMP frame (only what the handshake needs).
struct StompFrame<'a> {
    command: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> StompFrame<'a> {
    /// Parses `COMMAND\nname:value\n...\n\nbody\0`; heart-beat EOLs before it are skipped,
    /// and nothing after the first NUL (the end of a frame) is read.
    fn parse(text: &'a str) -> Option<Self> {
        let text = text.split('\0').next()?.trim_start_matches(['\n', '\r']);
        let head = text.split("\n\n").next()?;
        let mut lines = head.lines().map(|l| l.trim_end_matches('\r'));
        let command = lines.next()?.trim();
        if command.is_empty() {
            return None;
        }
        let headers = lines.filter_map(|l| l.split_once(':')).collect();
        Some(Self { command, headers })
    }

    /// The first value of `name` (STOMP 1.2: the first one wins).
    fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }
}

/// STOMP 1.2 header escaping.
fn stomp_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace(':', "\\c")
}

/// Most characters of client input an ERROR frame repeats.
const ECHO_CHARS: usize = 64;
/// Longest subscription or receipt id accepted: the server repeats them in every frame it sends
/// for them.
const MAX_ID_BYTES: usize = 256;

/// Client input as an ERROR frame may repeat it: its first [`ECHO_CHARS`] characters, quoted,
/// with control characters (NUL, EOL, ...) escaped, and `...` when there was more. However
/// large and whatever the input, the echo is short and cannot end or break the frame.
fn echo(input: &str) -> String {
    let shown: String = input.chars().take(ECHO_CHARS).collect();
    let more = if input.len() > shown.len() { "..." } else { "" };
    format!("{shown:?}{more}")
}

/// A STOMP 1.2 ERROR frame saying `message` (text this module wrote, client input only
/// through [`echo`]), with `extra` header lines (`name:value\n`).
fn stomp_error(message: &str, extra: &str) -> Message {
    Message::Text(
        format!(
            "ERROR\n{extra}message:{}\ncontent-type:text/plain\ncontent-length:{}\n\n{message}\0",
            stomp_escape(message),
            message.len()
        )
        .into(),
    )
}

/// Why the handshake ended without a subscription.
enum Refused {
    /// The peer left, or said DISCONNECT: nothing to answer.
    Gone,
    /// Answer an ERROR frame with this message and these extra header lines.
    Error(String, &'static str),
}

impl Refused {
    fn error(message: String) -> Self {
        Refused::Error(message, "")
    }
}

/// The answer to a CONNECT (or STOMP) frame: the server speaks STOMP 1.2 only, and a frame
/// without `accept-version` comes from a STOMP 1.0 client (STOMP 1.2, "Protocol Negotiation").
fn negotiate(frame: &StompFrame<'_>) -> Result<Message, Refused> {
    let accepts_1_2 = frame
        .header("accept-version")
        .is_some_and(|v| v.split(',').any(|v| v.trim() == "1.2"));
    if !accepts_1_2 {
        return Err(Refused::Error(
            "Supported protocol versions are 1.2".to_owned(),
            "version:1.2\n",
        ));
    }
    Ok(Message::Text(
        "CONNECTED\nversion:1.2\nheart-beat:0,0\nserver:inbound-web\n\n\0".into(),
    ))
}

/// The answer to a DISCONNECT with the `receipt` header `receipt` (empty: none asked for).
fn receipt_for(receipt: &str) -> Option<Message> {
    if receipt.len() > MAX_ID_BYTES {
        let message = format!("the receipt header is longer than {MAX_ID_BYTES} bytes");
        return Some(stomp_error(&message, ""));
    }
    let frame = format!("RECEIPT\nreceipt-id:{}\n\n\0", stomp_escape(receipt));
    (!receipt.is_empty()).then(|| Message::Text(frame.into()))
}

/// The subscription of a SUBSCRIBE frame, if it is one to `expected`.
fn subscribe(frame: &StompFrame<'_>, expected: &str) -> Result<Framing, Refused> {
    let id = frame.header("id").unwrap_or_default();
    let destination = frame.header("destination").unwrap_or_default();
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(Refused::error(format!(
            "SUBSCRIBE needs an id header of 1 to {MAX_ID_BYTES} bytes"
        )));
    }
    if destination != expected {
        return Err(Refused::error(format!(
            "this stream serves destination {expected}, not {}",
            echo(destination)
        )));
    }
    Ok(Framing::Stomp {
        subscription: id.to_owned(),
        destination: expected.to_owned(),
        next_id: 0,
    })
}

/// STOMP 1.2 over the socket: `CONNECT` (or `STOMP`) -> `CONNECTED`, then one `SUBSCRIBE` to
/// `/topic/gates/{gate}` (the stream's gate), then the same frames as the JSON stream, each
/// the body of a `MESSAGE`; `DISCONNECT` is answered with its `RECEIPT`. Anything else during
/// the handshake is an `ERROR` frame and the end of the connection (STOMP 1.2 section 5.1).
async fn serve_stomp(mut socket: WebSocket, rt: Arc<GateRuntime>, gate: GateId) {
    let expected = format!("/topic/gates/{gate}");
    let handshake = async {
        let mut connected = false;
        loop {
            let text = match socket.recv().await {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Close(_)) | Err(_)) | None => return Err(Refused::Gone),
                Some(Ok(_)) => continue,
            };
            let Some(frame) = StompFrame::parse(text.as_str()) else {
                continue; // a heart-beat
            };
            match (connected, frame.command) {
                (false, "CONNECT" | "STOMP") => {
                    if socket.send(negotiate(&frame)?).await.is_err() {
                        return Err(Refused::Gone);
                    }
                    connected = true;
                }
                (true, "SUBSCRIBE") => return subscribe(&frame, &expected),
                (true, "DISCONNECT") => return Err(Refused::Gone),
                (_, other) => {
                    return Err(Refused::error(format!("unexpected {} frame", echo(other))));
                }
            }
        }
    };
    let refused = match tokio::time::timeout(Duration::from_secs(10), handshake).await {
        Ok(Ok(framing)) => return serve(socket, framing, rt, gate).await,
        Ok(Err(refused)) => refused,
        Err(_) => Refused::error("no CONNECT and SUBSCRIBE within 10 s".to_owned()),
    };
    if let Refused::Error(message, extra) = refused {
        let _ = tokio::time::timeout(SEND_TIMEOUT, socket.send(stomp_error(&message, extra))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: Message) -> String {
        match m {
            Message::Text(t) => t.as_str().to_owned(),
            other => panic!("not a text frame: {other:?}"),
        }
    }

    #[test]
    fn an_echo_is_short_quoted_and_free_of_control_characters() {
        let junk = format!("{}\0\n{}", "X".repeat(100_000), "Y".repeat(10));
        let e = echo(&junk);
        assert!(e.len() < 80, "{e}");
        assert!(e.ends_with("\"..."), "{e}");
        assert_eq!(echo("A\0B\r\n"), "\"A\\0B\\r\\n\"");
        let frame = text(stomp_error(
            &format!("unexpected {} frame", echo(&junk)),
            "",
        ));
        assert!(frame.len() < 300, "{frame}");
        assert_eq!(
            frame.find('\0'),
            Some(frame.len() - 1),
            "one NUL, at the end"
        );
    }

    #[test]
    fn frames_end_at_their_nul() {
        let f = StompFrame::parse("\nCONNECT\naccept-version:1.2\0SUBSCRIBE\nid:0\n\n\0")
            .expect("a frame");
        assert_eq!(f.command, "CONNECT");
        assert_eq!(f.header("id"), None);
    }

    #[test]
    fn connect_without_accept_version_is_stomp_1_0_and_refused() {
        for (frame, ok) in [
            ("CONNECT\nhost:gates\n\n", false),
            ("STOMP\naccept-version:1.0,1.1\n\n", false),
            ("CONNECT\naccept-version:1.1, 1.2\n\n", true),
        ] {
            let f = StompFrame::parse(frame).expect("a frame");
            match negotiate(&f) {
                Ok(m) => assert!(
                    ok && text(m).starts_with("CONNECTED\nversion:1.2\n"),
                    "{frame}"
                ),
                Err(Refused::Error(message, extra)) => {
                    assert!(!ok, "{frame}");
                    let e = text(stomp_error(&message, extra));
                    assert!(e.starts_with("ERROR\nversion:1.2\n"), "{e}");
                }
                Err(Refused::Gone) => panic!("{frame}"),
            }
        }
    }
}
