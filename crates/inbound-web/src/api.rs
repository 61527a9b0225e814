//! The JSON API of the reference app: `POST /v1/evaluate`, `/healthz`, `/readyz`, `/metrics`.
//!
//! `/v1/evaluate` is the sidecar path and the hot one: the body is parsed with borrowed
//! strings (copied only when they hold escapes), the policy is found by name without
//! allocating, and a decision's response body is written by hand into one allocation of its
//! exact size (every string in it is a policy id, `[a-z0-9_-]`, or a fixed name, so nothing
//! needs escaping).

use std::sync::Arc;

use app_bootstrap::GateRuntime;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::limiter::names;
use edge_middleware::{Limiter, Member, problem};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use shared_contract::{EvaluationId, MultiOutcome, Readiness};

use crate::body::Text;
use crate::response::{json, request_error, respond, respond_replayed};
use crate::state::ApiState;

/// A `/v1/evaluate` body: the single form (`policy`, `subject`, `cost`) or the list form
/// (`requests`), either with an optional `evaluation_id`.
#[derive(Deserialize)]
struct EvaluateBody<'a> {
    #[serde(borrow, default)]
    policy: Option<Text<'a>>,
    #[serde(borrow, default)]
    subject: Option<Text<'a>>,
    #[serde(default)]
    cost: Option<i64>,
    #[serde(borrow, default)]
    evaluation_id: Option<Text<'a>>,
    /// Each entry an object too ([`crate::body::Object`]).
    #[serde(borrow, default)]
    requests: Option<Vec<crate::body::Object<crate::evaluate_list::Entry<'a>>>>,
}

/// `POST /v1/evaluate` with `{"policy"?, "subject", "cost"?, "evaluation_id"?}` (policy: the
/// default one; cost: 1), or the list form `{"requests": [...], "evaluation_id"?}`
/// ([`crate::evaluate_list`]). 200 allowed, 429 denied (both with the decision), 503 when the
/// provider could not decide and the failure policy does not let the request through, or
/// when rate limiting is disabled; 400 problem+json for a body the limiter refuses. A retry
/// with the same `evaluation_id` answers the first decision with `"replayed":true`.
pub async fn evaluate(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let Some(limiter) = state.limiter() else {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"rate_limit_disabled"}"#.to_owned(),
        );
    };
    let parsed: EvaluateBody<'_> = match crate::body::parse(&body) {
        Ok(b) => b,
        Err(e) => return problem::bad_request("malformed_json", &format!("malformed JSON: {e}")),
    };
    let evaluation_id = match parsed
        .evaluation_id
        .as_ref()
        .map(|t| EvaluationId::new(&t.0))
    {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(_)) => {
            return problem::bad_request(
                "invalid_evaluation_id",
                &format!(
                    "evaluation_id must be 1..={} visible ASCII characters",
                    EvaluationId::MAX_LEN
                ),
            );
        }
    };
    if let Some(entries) = parsed.requests {
        if parsed.policy.is_some() || parsed.subject.is_some() || parsed.cost.is_some() {
            return problem::bad_request(
                "mixed_forms",
                "give either requests (the list form) or policy, subject and cost, not both",
            );
        }
        return crate::evaluate_list::evaluate(&state, limiter, &entries, evaluation_id).await;
    }
    let subject = parsed.subject.as_ref().map(|t| &*t.0);
    let policy = parsed.policy.as_ref().map(|t| &*t.0);
    let (index, cost) = match state.admit(limiter, policy, subject, parsed.cost, "") {
        Ok(admitted) => admitted,
        Err(refused) => return refused.response(),
    };
    let subject = subject.unwrap_or_default().as_bytes();
    let Some(id) = evaluation_id else {
        let outcome = match limiter.evaluate(index, subject, cost).await {
            Ok(o) => o,
            // Checked above already; the port's own check is authoritative (nothing consumed).
            Err(e) => return request_error(&e),
        };
        return respond(limiter, &outcome);
    };
    let member = Member {
        index,
        subject: limiter.digest(subject),
        cost,
    };
    match limiter.evaluate_all(&[member], Some(id)).await {
        Ok(MultiOutcome::Evaluated(d)) => match d.decisions.first() {
            Some(first) => respond_replayed(limiter, first, d.replayed),
            None => problem::internal("a decision without its member"),
        },
        Ok(failure) => respond(limiter, &failure.into_single(limiter.policy(index).id())),
        Err(e) => request_error(&e),
    }
}

/// `GET /v1/config`: 200 with the view; 404 problem+json when the app runs without one (a
/// router built by a library user).
pub async fn config(State(state): State<Arc<ApiState>>) -> Response {
    match state.config_view() {
        Some(view) => json(StatusCode::OK, view.body().to_string()),
        None => edge_middleware::problem::not_found(),
    }
}

/// `GET /healthz`: 200 while the process serves.
pub async fn healthz() -> Response {
    json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned())
}

/// `GET /readyz`: every configured provider, the rate limiter's and the event gates', each
/// with its reason when it cannot serve.
///
/// 200 `ready` when all can serve. Rate limiting: with it disabled, or a failure policy that
/// keeps answering (`fail_open`, `fallback_local`), a provider that cannot evaluate is
/// reported (`degraded`, still 200) but is not a reason to take the instance out of service;
/// with `fail_closed` it is 503 `not_ready`. Event gates have no fallback: gates that cannot
/// serve (not connected, an ACL user without their commands, stored state of another mode or
/// duration) make it 503 `not_ready`, with `gates.reason`.
pub async fn readyz(state: Arc<ApiState>, gates: Option<Arc<GateRuntime>>) -> Response {
    let (mut body, mut out_of_service) = match state.limiter() {
        None => (
            serde_json::json!({"status": "ready", "rate_limit": "disabled"}),
            false,
        ),
        Some(limiter) => rate_limit_readiness(limiter).await,
    };
    if let Some(rt) = gates {
        let mut g = serde_json::json!({"provider": rt.provider_name(), "status": "ready"});
        if let Readiness::NotReady(why) = rt.port().readiness().await {
            g["status"] = "not_ready".into();
            g["reason"] = why.into();
            out_of_service = true;
        }
        body["gates"] = g;
    }
    if out_of_service {
        body["status"] = "not_ready".into();
    }
    let status = if out_of_service {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    json(status, body.to_string())
}

/// The rate limiter's part of `/readyz`, and whether it takes the instance out of service.
async fn rate_limit_readiness(limiter: &Limiter) -> (serde_json::Value, bool) {
    let provider = limiter.provider_name();
    match limiter.port().readiness().await {
        Readiness::Ready => (
            serde_json::json!({"status": "ready", "provider": provider}),
            false,
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
            (body, !degraded)
        }
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    // The breaker exports its state on every transition; refreshing it here as well keeps
    // the gauge right even if the recorder was installed after the breaker was built.
    if let Some(gauge) = state.limiter().and_then(|l| l.breaker_gauge()) {
        metrics::gauge!(names::BREAKER_STATE).set(gauge);
    }
    let text = state
        .prometheus()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    #[test]
    fn strings_are_borrowed_unless_escaped_and_refused_like_string() {
        let b: EvaluateBody<'_> =
            serde_json::from_str(r#"{"policy":"api","subject":"us\u0065r-42"}"#).expect("valid");
        assert!(matches!(b.policy, Some(Text(Cow::Borrowed("api")))));
        assert!(matches!(b.subject, Some(Text(Cow::Owned(ref s))) if s == "user-42"));
        let b: EvaluateBody<'_> = serde_json::from_str(r#"{"subject":null}"#).expect("valid");
        assert!(b.subject.is_none() && b.policy.is_none());
        for body in [
            r#"{"subject":5}"#,
            r#"{"subject":["a"]}"#,
            r#"{"policy":true}"#,
        ] {
            let ours = serde_json::from_str::<EvaluateBody<'_>>(body)
                .err()
                .map(|e| e.to_string());
            #[derive(Debug, Deserialize)]
            #[allow(dead_code)]
            struct Owned {
                #[serde(default)]
                policy: Option<String>,
                #[serde(default)]
                subject: Option<String>,
            }
            let owned = serde_json::from_str::<Owned>(body)
                .err()
                .map(|e| e.to_string());
            assert!(ours.is_some());
            assert_eq!(ours, owned, "{body}");
        }
    }
}
