//! The lease routes: `POST /v1/leases` acquires one lease of a concurrency policy,
//! `DELETE /v1/leases/{lease_id}` releases it.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/leases` `{"policy","subject"}` | 201 `{"lease_id","policy","expires_at_ms","expires_in_ms","lease_ttl_ms","limit","remaining","source","certainty"}`; 429 problem+json `lease_limit_reached` with `Retry-After`; 503 problem+json when the provider could not answer (no lease is held by that answer); 400 for a bad body, an unknown or a rate policy |
//! | `DELETE /v1/leases/{lease_id}` (`?subject=` optional) | 200 `{"released":true,"outcome":"released"}`; 410 `lease_expired` (it had expired, its place was free already); 404 `lease_not_held` (released before, never acquired, or reclaimed after expiry); 403 `subject_mismatch` when `subject` is given and is not the lease's (nothing is released); 400 `invalid_lease_id` naming the bad part, or `missing_subject` / `subject_too_long` for an empty or long `subject`; 503 when the provider could not answer |

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::leases::respond::not_acquired;
use edge_middleware::problem;
use serde::Deserialize;
use shared_contract::{AcquireOutcome, LeaseId, ReleaseOutcome};

use crate::body::{Text, checked_subject};
use crate::response::{json, request_error};
use crate::state::ApiState;

#[derive(Deserialize)]
struct AcquireBody<'a> {
    #[serde(borrow, default)]
    policy: Option<Text<'a>>,
    #[serde(borrow, default)]
    subject: Option<Text<'a>>,
}

/// `POST /v1/leases`: see the module docs.
pub async fn acquire(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let Some(limiter) = state.limiter() else {
        return disabled();
    };
    let parsed: AcquireBody<'_> = match crate::body::parse(&body) {
        Ok(b) => b,
        Err(e) => return problem::bad_request("malformed_json", &format!("malformed JSON: {e}")),
    };
    let Some(name) = parsed.policy.as_ref().map(|t| &*t.0) else {
        return problem::bad_request("missing_policy", "policy is required");
    };
    let Some(index) = state.policy_index(name) else {
        return problem::bad_request(
            "unknown_policy",
            &format!(
                "unknown policy {:?}",
                name.chars().take(80).collect::<String>()
            ),
        );
    };
    let subject = match checked_subject(parsed.subject.as_ref().map(|t| &*t.0), "") {
        Ok(s) => s,
        Err(refused) => return refused.response(),
    };
    let outcome = match limiter
        .acquire(index, limiter.digest(subject.as_bytes()))
        .await
    {
        Ok(o) => o,
        Err(e) => return request_error(&e),
    };
    let AcquireOutcome::Acquired(lease) = &outcome else {
        return not_acquired(&outcome)
            .unwrap_or_else(|| problem::internal("an acquired lease answered as not acquired"));
    };
    let body = serde_json::json!({
        "lease_id": lease.id.to_string(),
        "policy": lease.id.policy_id.as_str(),
        "expires_at_ms": lease.expires_at_ms,
        "expires_in_ms": lease.ttl_ms,
        "lease_ttl_ms": lease.ttl_ms,
        "limit": lease.limit,
        "remaining": lease.remaining,
        "source": lease.source.as_str(),
        "certainty": lease.certainty.as_str(),
    });
    json(StatusCode::CREATED, body.to_string())
}

fn disabled() -> Response {
    json(
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":"rate_limit_disabled"}"#.to_owned(),
    )
}

/// The query of `DELETE /v1/leases/{lease_id}`: an optional `subject`, the raw subject the lease
/// must belong to.
#[derive(Debug, Deserialize)]
pub struct ReleaseQuery {
    subject: Option<String>,
}

/// `DELETE /v1/leases/{lease_id}`: see the module docs.
pub async fn release(
    State(state): State<Arc<ApiState>>,
    Path(lease_id): Path<String>,
    Query(query): Query<ReleaseQuery>,
) -> Response {
    let Some(limiter) = state.limiter() else {
        return disabled();
    };
    let lease = match LeaseId::parse(&lease_id) {
        Ok(l) => l,
        Err(e) => return problem::bad_request("invalid_lease_id", &e.to_string()),
    };
    if let Some(subject) = &query.subject {
        let subject = match checked_subject(Some(subject), "") {
            Ok(s) => s,
            Err(refused) => return refused.response(),
        };
        if limiter.digest(subject.as_bytes()) != lease.subject {
            return problem::about_blank(
                StatusCode::FORBIDDEN,
                Some("subject_mismatch"),
                Some("the lease belongs to another subject; nothing was released"),
            );
        }
    }
    match limiter.release(lease).await {
        Ok(outcome) => released(&outcome),
        Err(e) => request_error(&e),
    }
}

fn released(outcome: &ReleaseOutcome) -> Response {
    let (status, error, detail, retry_ms) = match outcome {
        ReleaseOutcome::Released => {
            return json(
                StatusCode::OK,
                r#"{"released":true,"outcome":"released"}"#.to_owned(),
            );
        }
        ReleaseOutcome::Expired => (
            StatusCode::GONE,
            "lease_expired",
            "the lease had expired; its place was free already",
            0,
        ),
        ReleaseOutcome::NotHeld => (
            StatusCode::NOT_FOUND,
            "lease_not_held",
            "no such lease is held: released before, never acquired, or reclaimed after expiry",
            0,
        ),
        ReleaseOutcome::Unavailable { retry_after_ms, .. }
        | ReleaseOutcome::Indeterminate { retry_after_ms } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "lease_unavailable",
            "the limiter could not answer; the lease expires by its TTL if it is held",
            *retry_after_ms,
        ),
        ReleaseOutcome::Incompatible { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "lease_unavailable",
            "the limiter could not answer; the lease expires by its TTL if it is held",
            0,
        ),
    };
    let mut r = problem::about_blank(status, Some(error), Some(detail));
    if retry_ms > 0 {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(edge_middleware::headers::ceil_secs(retry_ms).max(1)),
        );
    }
    r
}
