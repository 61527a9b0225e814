//! The listener's limits (`inbound_grpc::Limits`) over loopback: the handshake and idle
//! timeouts on raw TCP, the announced HTTP/2 settings, the message size and the connection cap.

use std::net::SocketAddr;
use std::time::Duration;

use inbound_grpc::Limits;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::{ask, client, descriptor, local_with, request};

/// The HTTP/2 client connection preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Waits (at most `within`) for the server to close `s`, reading and discarding what it
/// sends; how long that took, `None` when it stayed open.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = std::time::Instant::now();
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

fn short_timeouts() -> Limits {
    Limits {
        handshake_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(800),
        ..Limits::default()
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_handshake_timeout() {
    let server = local_with(short_timeouts()).await;
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let took = closed_within(&mut silent, Duration::from_secs(5))
        .await
        .expect("a silent connection is closed, not kept forever");
    assert!(
        took >= Duration::from_millis(300),
        "closed after {took:?}, before the 400 ms handshake timeout"
    );
    // Half a preface is no handshake either.
    let mut half = TcpStream::connect(server.addr).await.expect("connect");
    half.write_all(&PREFACE[..10]).await.expect("write");
    closed_within(&mut half, Duration::from_secs(5))
        .await
        .expect("a connection that sent half a preface is closed");
    // The server still answers.
    let mut c = client(&server).await;
    ask(&mut c, request(vec![descriptor(&[("user", "u1")])], 1))
        .await
        .expect("answered");
}

#[tokio::test]
async fn a_connection_without_calls_is_closed_after_the_idle_timeout_and_one_with_calls_is_not() {
    let server = local_with(short_timeouts()).await;
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(PREFACE).await.expect("write the preface");
    // Past the handshake timeout, and not yet idle for 800 ms: still open.
    assert!(
        closed_within(&mut idle, Duration::from_millis(450))
            .await
            .is_none(),
        "closed before the idle timeout"
    );
    // A client that keeps calling keeps its connection past several idle timeouts.
    let mut c = client(&server).await;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(2_000) {
        ask(&mut c, request(vec![descriptor(&[("user", "busy")])], 1))
            .await
            .expect("a busy connection stays open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The silent one was sent GOAWAY and closed within about one idle timeout (checked every
    // quarter of it).
    closed_within(&mut idle, Duration::from_millis(100))
        .await
        .expect("the connection without calls was closed within 2.5 s");
}

/// The settings of the server's first SETTINGS frame on a new connection.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(PREFACE).await.expect("write the preface");
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.expect("a frame header");
    assert_eq!(head[3], 0x4, "the first frame is SETTINGS: {head:?}");
    let len = usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.expect("the settings");
    payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_server_announces_its_stream_and_header_limits() {
    let server = local_with(Limits {
        max_concurrent_streams: 7,
        ..Limits::default()
    })
    .await;
    let settings = server_settings(server.addr).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS (3) and SETTINGS_MAX_HEADER_LIST_SIZE (6).
    assert!(settings.contains(&(3, 7)), "{settings:?}");
    assert!(
        settings.contains(&(6, inbound_grpc::MAX_HEADER_LIST_BYTES)),
        "{settings:?}"
    );
}

#[tokio::test]
async fn a_message_over_the_configured_size_is_invalid_argument_and_charges_nothing() {
    let server = local_with(Limits {
        max_message_bytes: 200,
        ..Limits::default()
    })
    .await;
    let mut c = client(&server).await;
    let big = request(
        vec![descriptor(&[("user", "u1"), ("pad", &"p".repeat(250))])],
        1,
    );
    let e = ask(&mut c, big).await.expect_err("over 200 bytes");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let r = ask(&mut c, request(vec![descriptor(&[("user", "u1")])], 1))
        .await
        .expect("answered");
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "the oversize call charged nothing"
    );
}

#[tokio::test]
async fn at_max_connections_a_connection_that_sent_nothing_makes_room_at_once() {
    let server = local_with(Limits {
        max_connections: 1,
        handshake_timeout: Duration::from_secs(30),
        ..Limits::default()
    })
    .await;
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let mut c = client(&server).await;
    ask(&mut c, request(vec![descriptor(&[("user", "u1")])], 1))
        .await
        .expect("answered");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "answered after {waited:?}: the silent connection kept the only place"
    );
    closed_within(&mut silent, Duration::from_millis(500))
        .await
        .expect("the silent connection was closed to make room");
}

#[tokio::test]
async fn at_max_connections_a_connection_that_spoke_keeps_its_place_and_others_wait() {
    let server = local_with(Limits {
        max_connections: 1,
        ..short_timeouts()
    })
    .await;
    // The one place is taken by a connection that sent its preface and then nothing: it is
    // not closed to make room, only by the 800 ms idle timeout; the client waits until then.
    let mut spoke = TcpStream::connect(server.addr).await.expect("connect");
    spoke.write_all(PREFACE).await.expect("write the preface");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let mut c = client(&server).await;
    ask(&mut c, request(vec![descriptor(&[("user", "u1")])], 1))
        .await
        .expect("answered once the idle connection is closed");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "answered after {waited:?}: the cap of 1 did not hold"
    );
    closed_within(&mut spoke, Duration::from_millis(100))
        .await
        .expect("the idle connection was closed");
}
