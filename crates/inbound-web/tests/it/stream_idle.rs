//! The gate stream's liveness on the real binary: the server pings every 15 s and closes a
//! peer it heard nothing from (not even a pong) for 45 s with 1001; a peer that reads (and so
//! answers the pings) stays. Takes about 50 s of wall time: the intervals are the product's.

use crate::common;

use std::time::{Duration, Instant};

use common::App;
use futures::StreamExt;
use inbound_web::gates::stream::{CLOSE_IDLE, IDLE_TIMEOUT, PING_INTERVAL};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const GATES: &str = r#"
[event_gates.live]
mode = "only_once"
duration = "1s"
"#;

#[tokio::test]
async fn a_silent_peer_is_closed_with_1001_and_a_reading_one_stays() {
    let app = App::start(GATES, &[]);
    let url = app
        .url("/v1/gates/live/stream")
        .replacen("http://", "ws://", 1);
    let mut silent = silent_peer(&app.addr).await;
    let (mut reading, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("reading subscriber");
    let started = Instant::now();
    // The reading peer polls its stream, which answers every ping with a pong.
    let reader = tokio::spawn(async move {
        let mut pings = 0;
        let until = IDLE_TIMEOUT + PING_INTERVAL / 2;
        while let Ok(Some(frame)) =
            tokio::time::timeout(until.saturating_sub(started.elapsed()), reading.next()).await
        {
            match frame {
                Ok(Message::Ping(_)) => pings += 1,
                Ok(Message::Close(c)) => return Err(format!("closed: {c:?}")),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(pings)
    });
    // The silent peer reads nothing until the idle timeout is well past, then reads what the
    // server sent: pings, then the close frame, then the end of the connection.
    tokio::time::sleep(IDLE_TIMEOUT + PING_INTERVAL / 2).await;
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut bytes))
        .await
        .expect("the server ended the connection")
        .expect("read");
    let frames = server_frames(&bytes);
    let pings = frames.iter().filter(|(op, _)| *op == 0x9).count();
    assert!(pings >= 2, "pings before the close: {frames:?}");
    let (op, payload) = frames.last().expect("frames");
    assert_eq!(*op, 0x8, "the last frame is a close: {frames:?}");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), CLOSE_IDLE);
    assert!(String::from_utf8_lossy(&payload[2..]).contains("idle"));
    let pings = reader
        .await
        .expect("reader")
        .expect("the reading peer stayed open");
    assert!(pings >= 3, "pinged every {PING_INTERVAL:?}: {pings}");
}

/// A WebSocket peer that completes the handshake and then never reads (so it never answers a
/// ping): a raw socket, since a client library would answer the pings it reads.
async fn silent_peer(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET /v1/gates/live/stream HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.expect("handshake");
    // Read the 101 response head byte by byte, so no frame after it is consumed here.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("response head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// The server's frames (unmasked, short payloads) as (opcode, payload).
fn server_frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 2 {
        let op = bytes[0] & 0x0f;
        let mut len = usize::from(bytes[1] & 0x7f);
        let mut at = 2;
        if len == 126 {
            len = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
            at = 4;
        }
        if bytes.len() < at + len {
            break;
        }
        frames.push((op, bytes[at..at + len].to_vec()));
        bytes = &bytes[at + len..];
    }
    frames
}
