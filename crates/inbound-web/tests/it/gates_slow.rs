//! A subscriber that does not read is closed with 1008 and a `slow subscriber` reason, and
//! the gate keeps answering meanwhile. In process (the gate routes on a loopback listener),
//! because filling the socket needs a large gate that is fastest to build on the port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use inbound_web::gates::GateApi;
use shared_contract::Deadline;
use shared_contract::gate::{EventId, EventKey, GateId, GateOutcome, SubmitRequest};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_does_not_read_is_closed_as_slow_and_the_gate_keeps_answering() {
    let settings = app_bootstrap::config::from_toml(
        "[event_gates.big]\nmode = \"only_once\"\nduration = \"1h\"\n",
    )
    .expect("valid");
    let rt = Arc::new(
        app_bootstrap::build_gates(&settings)
            .await
            .expect("built")
            .expect("some"),
    );
    let gate = GateId::new("big").expect("id");
    let submit = |i: usize| {
        let rt = rt.clone();
        let gate = gate.clone();
        async move {
            rt.port()
                .submit(SubmitRequest {
                    gate,
                    // 200-byte keys: 40 000 incubating events make a snapshot frame of ~11 MB,
                    // more than a loopback socket holds with a small receive buffer.
                    key: EventKey::new(&format!("{i:0>200}")).expect("key"),
                    id: EventId::new(&format!("e{i}")).expect("id"),
                    deadline: Deadline::within(Duration::from_secs(5)).expect("deadline"),
                })
                .await
                .expect("known gate")
        }
    };
    for i in 0..40_000 {
        assert!(matches!(submit(i).await, GateOutcome::Evaluated(_)));
    }
    let router = inbound_web::gates::router(Arc::new(GateApi::new(Some(rt.clone()))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    // A client with a small receive buffer that does not read.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let tcp = socket.connect(addr).await.expect("connect");
    let mut config = WebSocketConfig::default();
    config.max_frame_size = None;
    config.max_message_size = None;
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(
        format!("ws://{addr}/v1/gates/big/stream"),
        tcp,
        Some(config),
    )
    .await
    .expect("upgrade");

    // While it stalls, the gate answers at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    assert!(matches!(submit(1_000_000).await, GateOutcome::Evaluated(_)));
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // Past the send timeout (2 s), read: the (partial) snapshot, then the close.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let close = loop {
        assert!(Instant::now() < deadline, "no close frame");
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => panic!("stream error before the close frame: {e}"),
            Ok(None) => panic!("stream ended without a close frame"),
            Err(_) => panic!("nothing within 10 s"),
        }
    };
    let close = close.expect("a close frame with a code");
    assert_eq!(u16::from(close.code), 1008);
    assert!(
        close.reason.as_str().starts_with("slow subscriber"),
        "{}",
        close.reason.as_str()
    );
    rt.shutdown().await;
    server.abort();
}
