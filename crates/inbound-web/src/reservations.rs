//! The reservation routes: a cost known only after the work (LLM tokens) is reserved as an
//! estimate, then settled with the actual cost or cancelled. Semantics:
//! docs/algorithms.md ("Reservations").
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/reservations` `{"requests":[{"policy","subject","cost"}...],"ttl_ms"}` | 201 `{"reservation_id","expires_in_ms","decisions":[...]}`; 429 as the list form of `/v1/evaluate` (nothing reserved); 400 naming the bad entry or `ttl_ms`; 503 problem+json `reservation_unavailable` (nothing reserved, whatever the failure policy) |
//! | `POST /v1/reservations/{id}/settle` `{"actual":[n...]}` | 200 `{"settled":true,"charged":[...],"decisions":[...]}`, `"replayed":true` for a retry; 404, 409, 410, 400 problem+json; 503 when the provider could not answer (retrying the settle is safe) |
//! | `DELETE /v1/reservations/{id}` | 200 `{"cancelled":true}`; 404, 409, 410 problem+json; 503 |
//!
//! `ttl_ms` defaults to 30,000 (1..=86,400,000). Entries are checked like the list form's
//! (each a known policy, a subject, a cost of `1..=max_cost`, no policy and subject twice);
//! a shadow policy is refused (a reservation is enforced or it is nothing to settle).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::headers::ceil_secs;
use edge_middleware::problem;
use serde::Deserialize;
use shared_contract::reservation::MAX_RESERVATION_TTL_MS;
use shared_contract::{
    MAX_LIMITS, Outcome, ReservationError, ReservationId, ReservationTtl, Reserved, Settled,
};

use crate::body::{Object, Refused};
use crate::evaluate_list::{Entry, decided, members};
use crate::response::{decision_json, json, push_joined, request_error};
use crate::state::ApiState;

/// The ttl of a reservation that names none.
pub const DEFAULT_TTL_MS: u64 = 30_000;

#[derive(Deserialize)]
struct ReserveBody<'a> {
    #[serde(borrow, default)]
    requests: Option<Vec<Object<Entry<'a>>>>,
    #[serde(default)]
    ttl_ms: Option<i64>,
}

#[derive(Deserialize)]
struct SettleBody {
    #[serde(default)]
    actual: Option<serde_json::Value>,
}

fn disabled() -> Response {
    json(
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":"rate_limit_disabled"}"#.to_owned(),
    )
}

/// `POST /v1/reservations`: see the module docs.
pub async fn reserve(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let Some(limiter) = state.limiter() else {
        return disabled();
    };
    let parsed: ReserveBody<'_> = match crate::body::parse(&body) {
        Ok(b) => b,
        Err(e) => return problem::bad_request("malformed_json", &format!("malformed JSON: {e}")),
    };
    let ttl_ms = parsed.ttl_ms.unwrap_or(DEFAULT_TTL_MS as i64);
    let Some(ttl) = u64::try_from(ttl_ms)
        .ok()
        .and_then(|ms| ReservationTtl::from_millis(ms).ok())
    else {
        return problem::bad_request(
            "invalid_ttl",
            &format!("ttl_ms must be 1..={MAX_RESERVATION_TTL_MS}, got {ttl_ms}"),
        );
    };
    let Some(entries) = parsed.requests else {
        return problem::bad_request("no_requests", "requests is required");
    };
    let members = match members(&state, limiter, &entries) {
        Ok(m) => m,
        Err(refused) => return refused.response(),
    };
    if let Some((i, m)) = members
        .iter()
        .enumerate()
        .find(|(_, m)| limiter.is_shadow(m.index))
    {
        return problem::bad_request(
            "shadow_policy",
            &format!(
                "requests[{i}]: policy {} is in shadow mode; reservations are enforced",
                limiter.policy(m.index).id()
            ),
        );
    }
    match limiter.reserve(&members, ttl).await {
        Ok(Outcome::Evaluated(r)) => reserved(&r),
        Ok(failure) => unavailable(&failure, "nothing was reserved"),
        Err(e) => request_error(&e),
    }
}

fn reserved(r: &Reserved) -> Response {
    let bodies: Vec<Bytes> = r.decision.decisions.iter().map(decision_json).collect();
    let Some(id) = r.id.filter(|_| r.decision.allowed) else {
        return decided(&r.decision, &bodies);
    };
    let mut body = format!(
        r#"{{"reservation_id":"{id}","expires_in_ms":{},"decisions":["#,
        r.expires_in_ms
    );
    push_joined(&mut body, &bodies);
    body.push_str("]}");
    json(StatusCode::CREATED, body)
}

/// 503 problem+json for an outcome without an answer, with what is known of it.
fn unavailable<T>(failure: &Outcome<T>, consequence: &str) -> Response {
    let (policy, retry_ms, category) = match failure {
        Outcome::Unavailable {
            policy_id,
            retry_after_ms,
            category,
        } => (policy_id, *retry_after_ms, Some(category.as_str())),
        Outcome::Indeterminate {
            policy_id,
            retry_after_ms,
        } => (policy_id, *retry_after_ms, None),
        Outcome::Incompatible {
            policy_id,
            category,
        } => (policy_id, 0, Some(category.as_str())),
        Outcome::Evaluated(_) => return problem::internal("an answer reported as a failure"),
    };
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "error": "reservation_unavailable",
        "detail": format!("the limiter could not answer ({}); {consequence}", failure.name()),
        "outcome": failure.name(),
        "policy": policy.as_str(),
        "retry_after_ms": retry_ms,
    });
    if let Some(category) = category {
        body["category"] = category.into();
    }
    let mut r = problem::respond(StatusCode::SERVICE_UNAVAILABLE, body);
    if retry_ms > 0 {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(ceil_secs(retry_ms).max(1)),
        );
    }
    r
}

/// The id of the path, or the 400 naming what is wrong with it.
fn parse_id(text: &str) -> Result<ReservationId, Refused> {
    ReservationId::parse(text).map_err(|e| Refused::new("invalid_reservation_id", &e.to_string()))
}

/// The problem+json of what the reservation's life refused; nothing was charged.
fn refused(e: &ReservationError) -> Response {
    let (status, error) = match e {
        ReservationError::Unknown => (StatusCode::NOT_FOUND, "reservation_not_found"),
        ReservationError::Expired { .. } => (StatusCode::GONE, "reservation_expired"),
        ReservationError::Cancelled => (StatusCode::CONFLICT, "reservation_cancelled"),
        ReservationError::Settled => (StatusCode::CONFLICT, "reservation_settled"),
        ReservationError::ActualAboveMax { .. } => {
            (StatusCode::BAD_REQUEST, "actual_above_max_cost")
        }
        ReservationError::ActualCount { .. } => (StatusCode::BAD_REQUEST, "actual_count"),
        _ => (StatusCode::BAD_REQUEST, "invalid_reservation_request"),
    };
    problem::about_blank(status, Some(error), Some(&e.to_string()))
}

/// The actual costs of a settle body: a list of 1..=`MAX_LIMITS` integers in
/// `0..=2^53-1`, or the 400 naming the first bad one.
fn actual_costs(body: &Bytes) -> Result<Vec<u64>, Refused> {
    let parsed: SettleBody = crate::body::parse(body)
        .map_err(|e| Refused::new("malformed_json", &format!("malformed JSON: {e}")))?;
    let invalid = |detail: &str| Refused::new("invalid_actual", detail);
    let Some(serde_json::Value::Array(values)) = parsed.actual else {
        return Err(invalid("actual must be a list of costs, one per request"));
    };
    if values.is_empty() || values.len() > MAX_LIMITS {
        return Err(invalid(&format!(
            "actual must hold 1..={MAX_LIMITS} costs, got {}",
            values.len()
        )));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .filter(|&n| n <= shared_contract::exact::MAX_SAFE_INTEGER)
                .ok_or_else(|| {
                    let shown: String = v.to_string().chars().take(40).collect();
                    invalid(&format!(
                        "actual[{i}] must be an integer in 0..=2^53-1, got {shown}"
                    ))
                })
        })
        .collect()
}

/// `POST /v1/reservations/{reservation_id}/settle`: see the module docs.
pub async fn settle(
    State(state): State<Arc<ApiState>>,
    Path(reservation_id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(limiter) = state.limiter() else {
        return disabled();
    };
    let id = match parse_id(&reservation_id) {
        Ok(id) => id,
        Err(refused) => return refused.response(),
    };
    let actual = match actual_costs(&body) {
        Ok(a) => a,
        Err(refused) => return refused.response(),
    };
    match limiter.settle(id, actual).await {
        Ok(Outcome::Evaluated(Ok(s))) => settled(&s),
        Ok(Outcome::Evaluated(Err(e))) => refused(&e),
        Ok(failure) => unavailable(
            &failure,
            "nothing is known to be settled; retrying the settle is safe",
        ),
        Err(e) => request_error(&e),
    }
}

fn settled(s: &Settled) -> Response {
    let bodies: Vec<Bytes> = s.decisions.iter().map(decision_json).collect();
    let mut body = String::from(r#"{"settled":true,"charged":["#);
    for (i, c) in s.charged.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        let _ = write!(body, "{c}");
    }
    body.push_str(r#"],"decisions":["#);
    push_joined(&mut body, &bodies);
    body.push(']');
    if s.replayed {
        body.push_str(r#","replayed":true"#);
    }
    body.push('}');
    json(StatusCode::OK, body)
}

/// `DELETE /v1/reservations/{reservation_id}`: see the module docs.
pub async fn cancel(
    State(state): State<Arc<ApiState>>,
    Path(reservation_id): Path<String>,
) -> Response {
    let Some(limiter) = state.limiter() else {
        return disabled();
    };
    let id = match parse_id(&reservation_id) {
        Ok(id) => id,
        Err(refused) => return refused.response(),
    };
    match limiter.cancel(id).await {
        Ok(Outcome::Evaluated(Ok(c))) => {
            let body = if c.replayed {
                r#"{"cancelled":true,"replayed":true}"#
            } else {
                r#"{"cancelled":true}"#
            };
            json(StatusCode::OK, body.to_owned())
        }
        Ok(Outcome::Evaluated(Err(e))) => refused(&e),
        Ok(failure) => unavailable(
            &failure,
            "nothing is known to be cancelled; retrying the cancel is safe",
        ),
        Err(e) => request_error(&e),
    }
}
