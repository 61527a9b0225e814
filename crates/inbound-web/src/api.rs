//! The JSON API of the reference app: `POST /v1/evaluate`, `/healthz`, `/readyz`, `/metrics`.
//!
//! `/v1/evaluate` is the sidecar path and the hot one: the body is parsed with borrowed
//! strings, the policy is found by name without allocating, and the response is written by
//! hand into one pre-sized buffer (every string in it is a policy id, `[a-z0-9_-]`, or a
//! fixed name, so nothing needs escaping).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use shared_contract::{Cost, RateLimitOutcome, Readiness};

use crate::headers::ceil_secs;
use crate::limiter::{Limiter, PolicyIndex};
use crate::problem;

/// Largest raw subject accepted, in bytes.
pub const MAX_SUBJECT_BYTES: usize = app_bootstrap::config::MAX_SUBJECT_BYTES;

/// What the API handlers share.
#[derive(Debug)]
pub struct ApiState {
    limiter: Option<Arc<Limiter>>,
    by_name: HashMap<Box<str>, PolicyIndex>,
    prometheus: Option<PrometheusHandle>,
}

impl ApiState {
    /// `limiter` is `None` when rate limiting is disabled.
    pub fn new(limiter: Option<Arc<Limiter>>, prometheus: Option<PrometheusHandle>) -> Self {
        let by_name = limiter
            .iter()
            .flat_map(|l| l.indexed())
            .map(|(i, p)| (Box::from(p.id().as_str()), i))
            .collect();
        Self {
            limiter,
            by_name,
            prometheus,
        }
    }

    pub fn limiter(&self) -> Option<&Arc<Limiter>> {
        self.limiter.as_ref()
    }
}

#[derive(Deserialize)]
struct EvaluateBody<'a> {
    #[serde(borrow, default)]
    policy: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    subject: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<i64>,
}

fn json(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `POST /v1/evaluate`. See interface.md for the JSON and the status codes.
pub async fn evaluate(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let Some(limiter) = &state.limiter else {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"rate_limit_disabled"}"#.to_owned(),
        );
    };
    let parsed: EvaluateBody<'_> = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return problem::bad_request("malformed_json", &format!("malformed JSON: {e}")),
    };
    let index = match parsed.policy.as_deref() {
        None => limiter.default_policy(),
        Some(name) => match state.by_name.get(name) {
            Some(&i) => i,
            None => {
                return problem::bad_request(
                    "unknown_policy",
                    &format!(
                        "unknown policy {:?}",
                        name.chars().take(80).collect::<String>()
                    ),
                );
            }
        },
    };
    let Some(subject) = parsed.subject else {
        return problem::bad_request("missing_subject", "subject is required");
    };
    if subject.len() > MAX_SUBJECT_BYTES {
        return problem::bad_request(
            "subject_too_long",
            &format!(
                "subject is {} bytes, at most {MAX_SUBJECT_BYTES} are accepted",
                subject.len()
            ),
        );
    }
    let policy = limiter.policy(index);
    let policy_id = policy.id();
    let max_cost = policy.max_cost().get();
    let cost = match parsed.cost.unwrap_or(1) {
        c if c >= 1 && (c as u64) <= max_cost => Cost::new(c as u64),
        c => {
            return problem::bad_request(
                "invalid_cost",
                &format!(
                    "cost must be between 1 and max_cost {max_cost} of policy {policy_id}, got {c}"
                ),
            );
        }
    };
    let Ok(cost) = cost else {
        return problem::bad_request("invalid_cost", "cost is out of range");
    };
    let outcome = match limiter.evaluate(index, subject.as_bytes(), cost).await {
        Ok(o) => o,
        // Checked above already; the port's own check is authoritative (nothing consumed).
        Err(e) => return problem::bad_request("invalid_request", &e.to_string()),
    };
    respond(limiter, &outcome)
}

/// The outcome as interface.md's JSON, with its status and `Retry-After`.
pub fn respond(limiter: &Limiter, outcome: &RateLimitOutcome) -> Response {
    let mut b = String::with_capacity(256);
    let allowed = limiter.allows(outcome);
    let (status, retry_ms) = match outcome {
        RateLimitOutcome::Evaluated(d) => {
            let _ = write!(
                b,
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
            if d.allowed {
                (StatusCode::OK, 0)
            } else {
                (StatusCode::TOO_MANY_REQUESTS, d.retry_after_ms.max(1))
            }
        }
        RateLimitOutcome::Unavailable {
            policy_id,
            retry_after_ms,
            category,
        } => {
            let _ = write!(
                b,
                r#"{{"outcome":"unavailable","policy":"{policy_id}","retry_after_ms":{retry_after_ms},"category":"{}""#,
                category.as_str()
            );
            (StatusCode::SERVICE_UNAVAILABLE, *retry_after_ms)
        }
        RateLimitOutcome::Indeterminate {
            policy_id,
            retry_after_ms,
        } => {
            let _ = write!(
                b,
                r#"{{"outcome":"indeterminate","policy":"{policy_id}","retry_after_ms":{retry_after_ms}"#
            );
            (StatusCode::SERVICE_UNAVAILABLE, *retry_after_ms)
        }
        RateLimitOutcome::Incompatible {
            policy_id,
            category,
        } => {
            let _ = write!(
                b,
                r#"{{"outcome":"incompatible","policy":"{policy_id}","category":"{}""#,
                category.as_str()
            );
            (StatusCode::SERVICE_UNAVAILABLE, 0)
        }
    };
    let status = if matches!(outcome, RateLimitOutcome::Evaluated(_)) {
        status
    } else {
        // No decision: the failure policy sets `allowed`; the outcome stays truthful.
        if allowed {
            b.push_str(r#","allowed":true}"#);
        } else {
            b.push('}');
        }
        if allowed { StatusCode::OK } else { status }
    };
    let mut r = json(status, b);
    if status != StatusCode::OK && retry_ms > 0 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(ceil_secs(retry_ms)));
    }
    r
}

/// `GET /healthz`: 200 while the process serves.
pub async fn healthz() -> Response {
    json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned())
}

/// `GET /readyz`: 200 when the provider can evaluate; 503 (with why) otherwise. With
/// rate limiting disabled, or a failure policy that keeps answering (`fail_open`,
/// `fallback_local`), a provider that cannot evaluate is reported but is not a reason to
/// take the instance out of service.
pub async fn readyz(State(state): State<Arc<ApiState>>) -> Response {
    let Some(limiter) = &state.limiter else {
        return json(
            StatusCode::OK,
            r#"{"status":"ready","rate_limit":"disabled"}"#.to_owned(),
        );
    };
    let provider = limiter.runtime().provider_name();
    match limiter.runtime().port().readiness().await {
        Readiness::Ready => json(
            StatusCode::OK,
            serde_json::json!({"status": "ready", "provider": provider}).to_string(),
        ),
        Readiness::NotReady(why) => {
            let policy = limiter.failure_policy();
            let degraded = policy != shared_contract::FailurePolicy::FailClosed;
            let body = serde_json::json!({
                "status": if degraded { "degraded" } else { "not_ready" },
                "provider": provider,
                "reason": why,
                "failure_policy": policy.as_str(),
            });
            let status = if degraded {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(status, body.to_string())
        }
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    // The breaker exports its state on every transition; refreshing it here as well keeps
    // the gauge right even if the recorder was installed after the breaker was built.
    if let Some(b) = state.limiter.as_ref().and_then(|l| l.breaker_state()) {
        metrics::gauge!(crate::limiter::names::BREAKER_STATE).set(b.gauge());
    }
    let text = state
        .prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
