//! RFC 9457 `application/problem+json` responses.
//!
//! 429 uses the quota-exceeded problem type of draft-ietf-httpapi-ratelimit-headers-11 with
//! its `violated-policies` member; every other status uses `about:blank` with the HTTP status
//! title ([`about_blank`]), plus a `detail` and machine-readable members (`outcome`,
//! `category`, `error`).
//!
//! Every response is generic over its body type `B`, which only has to be buildable from the
//! JSON text (`From<String>`: axum's `Body`, `String`, http-body-util's `Full<Bytes>`), so
//! the same problems serve any tower stack.

use http::{HeaderValue, Response, StatusCode, header};
use serde_json::json;
use shared_contract::RateLimitOutcome;

/// The media type of every problem body.
pub const CONTENT_TYPE: &str = "application/problem+json";
/// The `type` of a 429: the quota-exceeded problem type of draft-ietf-httpapi-ratelimit-headers-11.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A problem+json response with `body` (which must carry `type`, `title` and `status`).
pub fn respond<B: From<String>>(status: StatusCode, body: serde_json::Value) -> Response<B> {
    let mut r = Response::new(B::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    r
}

/// 429 for a request that exceeded `violated` policies.
pub fn quota_exceeded<B: From<String>>(violated: &[&str]) -> Response<B> {
    respond(
        StatusCode::TOO_MANY_REQUESTS,
        json!({
            "type": QUOTA_EXCEEDED,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "violated-policies": violated,
        }),
    )
}

/// 503 for an outcome that is not a decision, under `fail_closed`.
pub fn unavailable<B: From<String>>(outcome: &RateLimitOutcome) -> Response<B> {
    let (category, retry) = match outcome {
        RateLimitOutcome::Unavailable {
            category,
            retry_after_ms,
            ..
        } => (Some(category.as_str()), Some(*retry_after_ms)),
        RateLimitOutcome::Indeterminate { retry_after_ms, .. } => (None, Some(*retry_after_ms)),
        RateLimitOutcome::Incompatible { category, .. } => (Some(category.as_str()), None),
        RateLimitOutcome::Evaluated(_) => (None, None),
    };
    let mut body = json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "the rate limiter could not decide this request; it fails closed",
        "outcome": outcome.name(),
        "policy": outcome.policy_id().as_str(),
    });
    if let Some(c) = category {
        body["category"] = c.into();
    }
    if let Some(ms) = retry {
        body["retry_after_ms"] = ms.into();
    }
    respond(StatusCode::SERVICE_UNAVAILABLE, body)
}

/// 400 for a request the limiter refuses to evaluate (`error` is a stable code).
pub fn bad_request<B: From<String>>(error: &str, detail: &str) -> Response<B> {
    about_blank(StatusCode::BAD_REQUEST, Some(error), Some(detail))
}

/// 500 for a configuration the port refused at run time (should not happen: validated).
pub fn internal<B: From<String>>(detail: &str) -> Response<B> {
    about_blank(StatusCode::INTERNAL_SERVER_ERROR, None, Some(detail))
}

/// 404 for a path no route serves.
pub fn not_found<B: From<String>>() -> Response<B> {
    about_blank(StatusCode::NOT_FOUND, None, None)
}

/// An `about:blank` problem of `status`: `title` is the status's phrase (RFC 9457 section
/// 4.2.1), `error` the stable code given or, without one, the phrase in snake case
/// (`method_not_allowed`); `detail` when given.
pub fn about_blank<B: From<String>>(
    status: StatusCode,
    error: Option<&str>,
    detail: Option<&str>,
) -> Response<B> {
    let title = title(status);
    let mut body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
    });
    body["error"] = match error {
        Some(error) => error.into(),
        None => title.to_ascii_lowercase().replace([' ', '-'], "_").into(),
    };
    if let Some(detail) = detail {
        body["detail"] = detail.into();
    }
    respond(status, body)
}

/// The phrase of `status` as RFC 9110 names it (which renamed 413 and 422 after the `http`
/// crate's table was written).
fn title(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "Content Too Large",
        StatusCode::UNPROCESSABLE_ENTITY => "Unprocessable Content",
        other => other.canonical_reason().unwrap_or("Error"),
    }
}
