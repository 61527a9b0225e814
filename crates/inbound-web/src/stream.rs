//! `GET /v1/gates/{gate}/stream`: a WebSocket of JSON text frames that lets a subscriber keep
//! a copy of the gate ([`shared_contract::gate::Replica`]).
//!
//! Frames, in clock order: first `{"type":"snapshot","clock","incubating"}`, then one
//! `{"type":"status","id","key","status","clock","at_ms","publish_at_ms"}` per update,
//! pulled with `updates_after(cursor)`; a fresh snapshot every [`SNAPSHOT_INTERVAL`] and
//! whenever the provider answers `Resync` (the updates after the cursor are gone).
//!
//! The key design decision: **a subscriber can only slow itself down.** Each connection pulls
//! from the provider with its own cursor, so a slow one never holds the gate or the other
//! subscribers back; and a frame the socket does not accept within [`SEND_TIMEOUT`] closes
//! the connection with code 1008 and the reason `slow subscriber: ...`, instead of buffering
//! without bound. The subscriber reconnects and starts again from a snapshot.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use app_bootstrap::GateRuntime;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use futures::stream::SplitSink;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use shared_contract::Deadline;
use shared_contract::gate::{GateClock, GateId, GateOutcome, UpdateBatch};

use crate::gates::{GateApi, snapshot_json, status_json};

/// How often a subscriber gets a fresh snapshot without asking.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(5);
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
    ws: WebSocketUpgrade,
) -> Response {
    let (rt, gate) = match api.resolve(&gate) {
        Ok((rt, gate)) => (rt.clone(), gate),
        Err(r) => return *r,
    };
    ws.on_upgrade(move |socket| serve(socket, rt, gate))
}

/// Why a connection ended.
enum End {
    /// The peer closed or the socket failed: nothing more to send.
    Gone,
    /// Close with this code and reason.
    Close(u16, String),
}

type Sink = SplitSink<WebSocket, Message>;

async fn send(sink: &mut Sink, frame: &Value) -> Result<(), End> {
    match tokio::time::timeout(
        SEND_TIMEOUT,
        sink.send(Message::Text(frame.to_string().into())),
    )
    .await
    {
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

async fn serve(socket: WebSocket, rt: Arc<GateRuntime>, gate: GateId) {
    let (mut sink, mut incoming) = socket.split();
    // The reader only notices the peer going away (axum answers pings itself).
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        while let Some(m) = incoming.next().await {
            if matches!(m, Err(_) | Ok(Message::Close(_))) {
                break;
            }
        }
        let _ = gone_tx.send(());
    });
    let end = tokio::select! {
        end = pump(&mut sink, &rt, &gate) => end,
        _ = &mut gone => End::Gone,
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

/// Sends a snapshot; answers its clock.
async fn send_snapshot(
    sink: &mut Sink,
    rt: &GateRuntime,
    gate: &GateId,
) -> Result<Option<GateClock>, End> {
    let deadline = Deadline::within(rt.budget()).map_err(|e| End::Close(1011, e.to_string()))?;
    match rt.port().snapshot(gate, deadline).await {
        Ok(GateOutcome::Evaluated(s)) => {
            let mut frame = snapshot_json(&s);
            frame["type"] = "snapshot".into();
            send(sink, &frame).await?;
            Ok(Some(s.clock))
        }
        Ok(GateOutcome::Incompatible { category }) => Err(End::Close(
            1011,
            format!("gate state incompatible ({})", category.as_str()),
        )),
        Ok(other) => {
            wait_after(&other).await;
            Ok(None)
        }
        Err(e) => Err(End::Close(1011, e.to_string())),
    }
}

/// Waits out a provider that could not answer (bounded, so the loop stays responsive).
async fn wait_after<T>(outcome: &GateOutcome<T>) {
    let ms = match outcome {
        GateOutcome::Unavailable { retry_after_ms, .. }
        | GateOutcome::Indeterminate { retry_after_ms } => *retry_after_ms,
        _ => 100,
    };
    tokio::time::sleep(Duration::from_millis(ms.clamp(10, 1000))).await;
}

async fn pump(sink: &mut Sink, rt: &GateRuntime, gate: &GateId) -> End {
    match pump_inner(sink, rt, gate).await {
        Ok(never) => match never {},
        Err(end) => end,
    }
}

async fn pump_inner(
    sink: &mut Sink,
    rt: &GateRuntime,
    gate: &GateId,
) -> Result<std::convert::Infallible, End> {
    let max = NonZeroUsize::new(BATCH).unwrap_or(NonZeroUsize::MIN);
    // `None`: no snapshot sent yet (or a resync is due).
    let mut cursor: Option<GateClock> = None;
    let mut last_snapshot = Instant::now();
    loop {
        let Some(after) = cursor else {
            cursor = send_snapshot(sink, rt, gate).await?;
            last_snapshot = Instant::now();
            continue;
        };
        if last_snapshot.elapsed() >= SNAPSHOT_INTERVAL {
            last_snapshot = Instant::now();
            // A snapshot read before an update already sent would go back in time: skip it.
            let deadline =
                Deadline::within(rt.budget()).map_err(|e| End::Close(1011, e.to_string()))?;
            if let Ok(GateOutcome::Evaluated(s)) = rt.port().snapshot(gate, deadline).await
                && s.clock >= after
            {
                let mut frame = snapshot_json(&s);
                frame["type"] = "snapshot".into();
                send(sink, &frame).await?;
                cursor = Some(s.clock);
                continue;
            }
        }
        let deadline = Deadline::within(PULL_WAIT.max(rt.budget()))
            .map_err(|e| End::Close(1011, e.to_string()))?;
        match rt.port().updates_after(gate, after, max, deadline).await {
            Ok(GateOutcome::Evaluated(UpdateBatch::Updates(updates))) => {
                for u in &updates {
                    send(sink, &status_json(u)).await?;
                    cursor = Some(u.clock);
                }
            }
            Ok(GateOutcome::Evaluated(UpdateBatch::Resync)) => cursor = None,
            Ok(GateOutcome::Incompatible { category }) => {
                return Err(End::Close(
                    1011,
                    format!("gate state incompatible ({})", category.as_str()),
                ));
            }
            Ok(other) => wait_after(&other).await,
            Err(e) => return Err(End::Close(1011, e.to_string())),
        }
    }
}
