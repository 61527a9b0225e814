//! The event-gate routes: submit, read one event, snapshot, and the WebSocket stream.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/gates/{gate}/events` | 202 submitted, 409 rejected, 200 duplicate (the event's current record), 409 problem+json `id_reused` (the id is held for another key) |
//! | `GET /v1/gates/{gate}/events/{id}` | 200 the event, 404 when the gate does not hold it |
//! | `GET /v1/gates/{gate}/snapshot` | 200 the incubating events and the clock |
//! | `GET /v1/gates/{gate}/stream` | WebSocket, see [`crate::gates::stream`] |
//!
//! An unknown gate (or no gate configured at all) is 404 problem+json; a provider that could
//! not answer (unavailable, indeterminate, incompatible) is 503 problem+json with the outcome
//! and, when known, `retry_after_ms` and a `Retry-After` header; a bad body, key or id is 400.

pub mod metrics;
pub mod stream;
pub mod subscribers;

use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use app_bootstrap::GateRuntime;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use edge_middleware::headers::ceil_secs;
use edge_middleware::problem;
use serde::Deserialize;
use serde_json::{Value, json};
use shared_contract::Deadline;
use shared_contract::gate::{
    EventId, EventKey, EventRecord, GateId, GateOutcome, GateRequestError, Snapshot, StatusUpdate,
    SubmitOutcome, SubmitRequest,
};

/// What the gate handlers share: the gates, when any is configured.
#[derive(Debug)]
pub struct GateApi {
    runtime: Option<Arc<GateRuntime>>,
    ids: Arc<IdMaker>,
    subscribers: Arc<crate::gates::subscribers::Subscribers>,
}

impl GateApi {
    /// `runtime` is `None` when no gate is configured (every gate route then answers 404).
    pub fn new(runtime: Option<Arc<GateRuntime>>) -> Self {
        Self {
            runtime,
            ids: Arc::new(IdMaker::new()),
            subscribers: crate::gates::subscribers::Subscribers::new(
                crate::gates::subscribers::MAX_SUBSCRIBERS_PER_GATE,
                crate::gates::subscribers::MAX_SUBSCRIBERS,
            ),
        }
    }

    /// The API over `runtime` (a reload that changed the gates) with this one's id maker and
    /// subscriber bounds: streams opened before and after count against the same bounds.
    #[must_use]
    pub fn with_runtime(&self, runtime: Option<Arc<GateRuntime>>) -> Self {
        Self {
            runtime,
            ids: self.ids.clone(),
            subscribers: self.subscribers.clone(),
        }
    }

    /// The live stream subscribers and their bounds.
    pub fn subscribers(&self) -> &Arc<crate::gates::subscribers::Subscribers> {
        &self.subscribers
    }

    /// The gate provider and its publisher; `None` when no gate is configured.
    pub fn runtime(&self) -> Option<&Arc<GateRuntime>> {
        self.runtime.as_ref()
    }

    /// The runtime and the gate id of a path, or the 404 to answer.
    /// (Boxed: a response is large, and the error path is the rare one.)
    pub(crate) fn resolve(&self, gate: &str) -> Result<(&Arc<GateRuntime>, GateId), Box<Response>> {
        let refuse = || Box::new(unknown_gate(gate));
        let rt = self.runtime.as_ref().ok_or_else(refuse)?;
        let id = GateId::new(gate).map_err(|_| refuse())?;
        if rt.port().gates().get(&id).is_none() {
            return Err(refuse());
        }
        Ok((rt, id))
    }
}

/// Server-made event ids: 16 hex characters from a per-process random key and a counter, so
/// two ids of one process never collide and ids of two processes collide only by chance.
#[derive(Debug)]
struct IdMaker {
    state: std::collections::hash_map::RandomState,
    counter: AtomicU64,
}

impl IdMaker {
    fn new() -> Self {
        Self {
            state: std::collections::hash_map::RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let mut h = self.state.build_hasher();
        h.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        format!("{:016x}", h.finish())
    }
}

/// The gate routes, with their state applied.
pub fn router(api: Arc<GateApi>) -> Router {
    Router::new()
        .route("/v1/gates/{gate}/events", post(submit))
        .route("/v1/gates/{gate}/events/{id}", get(event))
        .route("/v1/gates/{gate}/snapshot", get(snapshot))
        .route("/v1/gates/{gate}/stream", get(crate::gates::stream::stream))
        .with_state(api)
}

/// A JSON answer of `body`, as every API answer is written (`response::json`).
fn json_response(status: StatusCode, body: &Value) -> Response {
    crate::response::json(status, body.to_string())
}

fn unknown_gate(gate: &str) -> Response {
    let shown: String = gate.chars().take(80).collect();
    let detail = format!("no gate {shown:?} is configured");
    problem::about_blank(StatusCode::NOT_FOUND, Some("unknown_gate"), Some(&detail))
}

fn request_error(e: &GateRequestError) -> Response {
    match e {
        GateRequestError::UnknownGate(g) => unknown_gate(g.as_str()),
        other => problem::internal(&other.to_string()),
    }
}

/// 503 for an outcome that is not an answer.
pub(crate) fn not_evaluated<T>(outcome: &GateOutcome<T>) -> Response {
    let mut body = json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "the event gate could not answer",
        "outcome": outcome.name(),
    });
    let mut retry = None;
    match outcome {
        GateOutcome::Unavailable {
            retry_after_ms,
            category,
        } => {
            body["category"] = category.as_str().into();
            retry = Some(*retry_after_ms);
        }
        GateOutcome::Indeterminate { retry_after_ms } => {
            body["detail"] =
                "the submission may or may not have taken effect; retrying with the same id is safe"
                    .into();
            retry = Some(*retry_after_ms);
        }
        GateOutcome::Incompatible { category } => {
            body["category"] = category.as_str().into();
        }
        GateOutcome::Evaluated(_) => {}
    }
    if let Some(ms) = retry {
        body["retry_after_ms"] = ms.into();
    }
    let mut r = problem::respond(StatusCode::SERVICE_UNAVAILABLE, body);
    if let Some(ms) = retry
        && let Ok(v) = HeaderValue::from_str(&ceil_secs(ms).max(1).to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The deadline of one gate call: the runtime's budget from now.
pub(crate) fn deadline(rt: &GateRuntime) -> Deadline {
    Deadline::clamped(std::time::Instant::now(), rt.budget())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    key: String,
    #[serde(default)]
    id: Option<String>,
}

async fn submit(
    State(api): State<Arc<GateApi>>,
    Path(gate): Path<String>,
    body: Bytes,
) -> Response {
    let (rt, gate) = match api.resolve(&gate) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let parsed: SubmitBody = match crate::body::parse(&body) {
        Ok(b) => b,
        Err(e) => {
            return problem::bad_request(
                "malformed_body",
                &format!("expected {{\"key\":\"...\",\"id\":\"...\"}} (id optional): {e}"),
            );
        }
    };
    let key = match EventKey::new(&parsed.key) {
        Ok(k) => k,
        Err(e) => return problem::bad_request("invalid_key", &e.to_string()),
    };
    let id = match EventId::new(&parsed.id.unwrap_or_else(|| api.ids.next())) {
        Ok(i) => i,
        Err(e) => return problem::bad_request("invalid_id", &e.to_string()),
    };
    let deadline = deadline(rt);
    let request = SubmitRequest {
        gate,
        key: key.clone(),
        id: id.clone(),
        deadline,
    };
    let counted_gate = request.gate.clone();
    let answer = rt.port().submit(request).await;
    let counted = match &answer {
        Err(_) => "refused",
        Ok(GateOutcome::Evaluated(o)) => match o {
            SubmitOutcome::Submitted { .. } => "submitted",
            SubmitOutcome::Rejected { .. } => "rejected",
            SubmitOutcome::Duplicate(_) => "duplicate",
            SubmitOutcome::IdReused(_) => "id_reused",
        },
        Ok(other) => crate::gates::metrics::not_evaluated_name(other),
    };
    crate::gates::metrics::submission(&counted_gate, counted);
    match answer {
        Err(e) => request_error(&e),
        Ok(GateOutcome::Evaluated(outcome)) => match outcome {
            SubmitOutcome::Submitted {
                clock,
                publish_at_ms,
            } => json_response(
                StatusCode::ACCEPTED,
                &json!({"status":"submitted","id":id.as_str(),"clock":clock.get(),
                        "publish_at_ms":publish_at_ms}),
            ),
            SubmitOutcome::Rejected {
                clock,
                conflicts_with,
            } => json_response(
                StatusCode::CONFLICT,
                &json!({"status":"rejected","id":id.as_str(),"clock":clock.get(),
                        "conflicts_with":conflicts_with.as_str()}),
            ),
            SubmitOutcome::Duplicate(record) => {
                let mut body = record_json(&record);
                body["duplicate"] = true.into();
                json_response(StatusCode::OK, &body)
            }
            SubmitOutcome::IdReused(held) => id_reused(&held, &key),
        },
        Ok(other) => not_evaluated(&other),
    }
}

/// 409 problem+json for an id the gate holds for another key: a client error, not a retry,
/// and nothing changed. Names the id, both keys (client data, at most 256 bytes each) and the
/// held event's status; a `rejected` answer is told apart by its `status` field.
fn id_reused(held: &EventRecord, key: &EventKey) -> Response {
    let detail = format!(
        "event id {:?} is held for key {:?}, not {:?}: this event was not received, nothing changed; use a new id",
        held.id.as_str(),
        held.key.as_str(),
        key.as_str()
    );
    problem::respond(
        StatusCode::CONFLICT,
        json!({
            "type": "about:blank",
            "title": "Conflict",
            "status": 409,
            "error": "id_reused",
            "detail": detail,
            "id": held.id.as_str(),
            "key": key.as_str(),
            "held_key": held.key.as_str(),
            "held_status": held.status.as_str(),
        }),
    )
}

/// `{"id","key","status","clock","submitted_at_ms","publish_at_ms"}`.
fn record_json(r: &EventRecord) -> Value {
    let mut v = json!({
        "id": r.id.as_str(),
        "key": r.key.as_str(),
        "status": r.status.as_str(),
        "clock": r.clock.get(),
        "submitted_at_ms": r.submitted_at_ms,
        "publish_at_ms": r.publish_at_ms,
    });
    if let Some(t) = r.terminal_at_ms {
        v["terminal_at_ms"] = t.into();
    }
    v
}

async fn event(
    State(api): State<Arc<GateApi>>,
    Path((gate, id)): Path<(String, String)>,
) -> Response {
    let (rt, gate) = match api.resolve(&gate) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Ok(event_id) = EventId::new(&id) else {
        return event_not_found();
    };
    let deadline = deadline(rt);
    match rt.port().event(&gate, &event_id, deadline).await {
        Err(e) => request_error(&e),
        Ok(GateOutcome::Evaluated(Some(r))) => json_response(StatusCode::OK, &record_json(&r)),
        Ok(GateOutcome::Evaluated(None)) => event_not_found(),
        Ok(other) => not_evaluated(&other),
    }
}

fn event_not_found() -> Response {
    problem::about_blank(
        StatusCode::NOT_FOUND,
        Some("unknown_event"),
        Some(
            "the gate does not hold this event (never submitted, rejected, or removed after its retention)",
        ),
    )
}

/// `{"clock":N,"incubating":[{"id","key","submitted_at_ms","publish_at_ms"}]}`.
pub(crate) fn snapshot_json(s: &Snapshot) -> Value {
    json!({
        "clock": s.clock.get(),
        "incubating": s.incubating.iter().map(|e| json!({
            "id": e.id.as_str(),
            "key": e.key.as_str(),
            "submitted_at_ms": e.submitted_at_ms,
            "publish_at_ms": e.publish_at_ms,
        })).collect::<Vec<_>>(),
    })
}

/// A stream frame of one update.
pub(crate) fn status_json(u: &StatusUpdate) -> Value {
    json!({
        "type": "status",
        "id": u.id.as_str(),
        "key": u.key.as_str(),
        "status": u.status.as_str(),
        "clock": u.clock.get(),
        "at_ms": u.at_ms,
        "publish_at_ms": u.publish_at_ms,
    })
}

async fn snapshot(State(api): State<Arc<GateApi>>, Path(gate): Path<String>) -> Response {
    let (rt, gate) = match api.resolve(&gate) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let deadline = deadline(rt);
    match rt.port().snapshot(&gate, deadline).await {
        Err(e) => request_error(&e),
        Ok(GateOutcome::Evaluated(s)) => json_response(StatusCode::OK, &snapshot_json(&s)),
        Ok(other) => not_evaluated(&other),
    }
}
