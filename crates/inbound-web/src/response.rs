//! How the API answers: JSON responses, a decision's body written by hand into one
//! allocation of its exact size (every string in it is a policy id, `[a-z0-9_-]`, or a fixed
//! name, so nothing needs escaping), an outcome that is not a decision, and a request the
//! port refused. Shared by the single and list forms of `/v1/evaluate`, the leases, the
//! configuration view and the OpenAPI document.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::headers::ceil_secs;
use edge_middleware::{Limiter, problem};
use shared_contract::{RateLimitDecision, RateLimitOutcome, RequestError};

pub(crate) fn json(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The answer to a request the port refused (nothing was consumed): 400 with a stable
/// `error` per reason, 503 when the provider holds as many evaluation ids or reservations as
/// it may, 501 when it keeps no reservations.
pub(crate) fn request_error(e: &RequestError) -> Response {
    let code = match e {
        RequestError::UnknownPolicy(_) => "unknown_policy",
        RequestError::CostAboveMax { .. } => "invalid_cost",
        RequestError::EvaluationIdUnsupported => "evaluation_id_unsupported",
        RequestError::NoLimits => "no_requests",
        RequestError::TooManyLimits { .. } => "too_many_limits",
        RequestError::DuplicateLimit { .. } => "duplicate_limit",
        RequestError::SpansSlots { .. } => "spans_slots",
        RequestError::ConcurrencyPolicy { .. } => "concurrency_policy",
        RequestError::NotConcurrencyPolicy { .. } => "not_concurrency_policy",
        RequestError::LeasesUnsupported => "leases_unsupported",
        RequestError::ReservationUnsupported { .. } => "reservation_unsupported",
        RequestError::ReservationsUnsupported => {
            return problem::about_blank(
                StatusCode::NOT_IMPLEMENTED,
                Some("reservations_unsupported"),
                Some(&e.to_string()),
            );
        }
        RequestError::ReservationsFull { .. } => {
            let mut r = problem::about_blank(
                StatusCode::SERVICE_UNAVAILABLE,
                Some("reservations_full"),
                Some(&e.to_string()),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            return r;
        }
        RequestError::EvaluationIdsFull { .. } => {
            let mut r = problem::about_blank(
                StatusCode::SERVICE_UNAVAILABLE,
                Some("evaluation_ids_full"),
                Some(&e.to_string()),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            return r;
        }
        _ => "invalid_request",
    };
    problem::bad_request(code, &e.to_string())
}

/// One decision as the single form answers it, with `"replayed":true` when it is the stored
/// first answer of a retried evaluation id.
pub(crate) fn respond_replayed(
    limiter: &Limiter,
    d: &RateLimitDecision,
    replayed: bool,
) -> Response {
    let mut r = respond(limiter, &RateLimitOutcome::Evaluated(d.clone()));
    if replayed {
        *r.body_mut() = Body::from(with_replayed(decision_body(limiter, d)));
    }
    r
}

/// A decision's JSON as the single form answers it: [`shadow_json`] for a policy in shadow
/// mode, [`decision_json`] otherwise.
pub(crate) fn decision_body(limiter: &Limiter, d: &RateLimitDecision) -> Bytes {
    if limiter
        .policies()
        .get(&d.policy_id)
        .is_some_and(|p| p.shadow())
    {
        shadow_json(d)
    } else {
        decision_json(d)
    }
}

/// `body` (a JSON object) with `"replayed":true` as its last member.
pub(crate) fn with_replayed(body: Bytes) -> Bytes {
    with_members(body, br#","replayed":true"#)
}

/// `body` (a JSON object) with `members` (`,"name":value...`) appended as its last members.
pub(crate) fn with_members(body: Bytes, members: &[u8]) -> Bytes {
    let mut v = body.to_vec();
    if v.last() == Some(&b'}') {
        v.pop();
        v.extend_from_slice(members);
        v.push(b'}');
    }
    Bytes::from(v)
}

/// A decision of a limit in shadow mode as `/v1/evaluate` answers it: `allowed` (the request
/// may go through, whatever the limit decided), `"shadow":true`, and `would_deny`, what the
/// limit decided.
pub(crate) fn shadow_json(d: &RateLimitDecision) -> Bytes {
    let admitted = RateLimitDecision {
        allowed: true,
        ..d.clone()
    };
    let extra: &[u8] = if d.allowed {
        br#","shadow":true,"would_deny":false"#
    } else {
        br#","shadow":true,"would_deny":true"#
    };
    with_members(decision_json(&admitted), extra)
}

/// The outcome as `/v1/evaluate`'s JSON (the decision, or `outcome`, `policy` and what is
/// known about the failure), with its status and `Retry-After`.
///
/// A policy in shadow mode never denies: its decision is 200 (`shadow_json`), and so is an
/// outcome that is not a decision (`"allowed":true,"shadow":true`).
pub fn respond(limiter: &Limiter, outcome: &RateLimitOutcome) -> Response {
    let (status, retry_ms, body) = outcome_body(limiter, outcome);
    let mut r = json(status, body);
    if status != StatusCode::OK && retry_ms > 0 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(ceil_secs(retry_ms)));
    }
    r
}

/// [`respond`]'s status, `Retry-After` hint (ms) and body.
pub(crate) fn outcome_body(
    limiter: &Limiter,
    outcome: &RateLimitOutcome,
) -> (StatusCode, u64, Bytes) {
    let shadow = limiter
        .policies()
        .get(outcome.policy_id())
        .is_some_and(|p| p.shadow());
    let (status, retry_ms, body) = match outcome {
        RateLimitOutcome::Evaluated(d) if shadow => (StatusCode::OK, 0, shadow_json(d)),
        RateLimitOutcome::Evaluated(d) if d.allowed => (StatusCode::OK, 0, decision_json(d)),
        RateLimitOutcome::Evaluated(d) => (
            StatusCode::TOO_MANY_REQUESTS,
            d.retry_after_ms.max(1),
            decision_json(d),
        ),
        RateLimitOutcome::Unavailable {
            policy_id,
            retry_after_ms,
            category,
        } => no_decision(
            limiter,
            outcome,
            format!(
                r#"{{"outcome":"unavailable","policy":"{policy_id}","retry_after_ms":{retry_after_ms},"category":"{}""#,
                category.as_str()
            ),
            *retry_after_ms,
        ),
        RateLimitOutcome::Indeterminate {
            policy_id,
            retry_after_ms,
        } => no_decision(
            limiter,
            outcome,
            format!(
                r#"{{"outcome":"indeterminate","policy":"{policy_id}","retry_after_ms":{retry_after_ms}"#
            ),
            *retry_after_ms,
        ),
        RateLimitOutcome::Incompatible {
            policy_id,
            category,
        } => no_decision(
            limiter,
            outcome,
            format!(
                r#"{{"outcome":"incompatible","policy":"{policy_id}","category":"{}""#,
                category.as_str()
            ),
            0,
        ),
    };
    let body = match outcome {
        RateLimitOutcome::Evaluated(_) => body,
        _ if shadow => with_members(body, br#","shadow":true"#),
        _ => body,
    };
    (status, retry_ms, body)
}

/// The end of an outcome that is not a decision: the failure policy sets `allowed` and the
/// status; the outcome stays truthful.
fn no_decision(
    limiter: &Limiter,
    outcome: &RateLimitOutcome,
    mut text: String,
    retry_ms: u64,
) -> (StatusCode, u64, Bytes) {
    let status = if limiter.allows(outcome) {
        text.push_str(r#","allowed":true}"#);
        StatusCode::OK
    } else {
        text.push('}');
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, retry_ms, Bytes::from(text))
}

/// Appends `parts` (JSON values) to `body`, separated by commas: the members of an array.
pub(crate) fn push_joined(body: &mut String, parts: &[Bytes]) {
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&String::from_utf8_lossy(part));
    }
}

/// A decision's JSON, in one allocation of its exact size.
pub(crate) fn decision_json(d: &RateLimitDecision) -> Bytes {
    let (mut limit, mut remaining, mut retry, mut reset, mut revision) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    let (mut share, mut size) = (itoa::Buffer::new(), itoa::Buffer::new());
    // A fallback decision with a known fleet says which share of the limit it enforced.
    let fleet: [&[u8]; 4] = match d.fleet {
        Some(f) => [
            br#","fleet_share":"#,
            share.format(f.share).as_bytes(),
            br#","fleet_size":"#,
            size.format(f.size).as_bytes(),
        ],
        None => [b""; 4],
    };
    let parts: [&[u8]; 24] = [
        br#"{"outcome":"evaluated","allowed":"#,
        if d.allowed { b"true" } else { b"false" },
        br#","limit":"#,
        limit.format(d.limit).as_bytes(),
        br#","remaining":"#,
        remaining.format(d.remaining).as_bytes(),
        br#","retry_after_ms":"#,
        retry.format(d.retry_after_ms).as_bytes(),
        br#","reset_at_ms":"#,
        reset.format(d.reset_at_ms).as_bytes(),
        br#","policy":""#,
        d.policy_id.as_str().as_bytes(),
        br#"","revision":"#,
        revision.format(d.revision.get()).as_bytes(),
        br#","source":""#,
        d.source.as_str().as_bytes(),
        br#"","certainty":""#,
        d.certainty.as_str().as_bytes(),
        b"\"",
        fleet[0],
        fleet[1],
        fleet[2],
        fleet[3],
        b"}",
    ];
    let mut body = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        body.extend_from_slice(part);
    }
    // Length equal to capacity: `Bytes` takes the buffer over without a second allocation.
    Bytes::from(body)
}

#[cfg(test)]
mod tests {
    use shared_contract::{Certainty, PolicyId, PolicyRevision, Source};

    use super::*;

    #[test]
    fn decision_json_is_the_interface_shape_byte_for_byte() {
        let d = RateLimitDecision {
            allowed: false,
            limit: 9_007_199_254_740_991,
            remaining: 0,
            retry_after_ms: 1_500,
            reset_at_ms: 1_764_000_000_123,
            policy_id: PolicyId::new("api_v2-x").expect("valid id"),
            revision: PolicyRevision::new(4_294_967_295).expect("valid"),
            source: Source::LocalFallback,
            certainty: Certainty::ApproximateFallback,
            fleet: None,
        };
        let expected = format!(
            r#"{{"outcome":"evaluated","allowed":{},"limit":{},"remaining":{},"retry_after_ms":{},"reset_at_ms":{},"policy":"{}","revision":{},"source":"{}","certainty":"{}"}}"#,
            d.allowed,
            d.limit,
            d.remaining,
            d.retry_after_ms,
            d.reset_at_ms,
            d.policy_id,
            d.revision,
            d.source.as_str(),
            d.certainty.as_str()
        );
        assert_eq!(decision_json(&d), expected.as_bytes());
        let d = RateLimitDecision { allowed: true, ..d };
        assert!(decision_json(&d).starts_with(br#"{"outcome":"evaluated","allowed":true,"#));
        let d = RateLimitDecision {
            fleet: Some(shared_contract::FleetShare { share: 3, size: 4 }),
            ..d
        };
        assert!(
            decision_json(&d).ends_with(
                br#""certainty":"approximate_fallback","fleet_share":3,"fleet_size":4}"#
            )
        );
    }
}
