//! The JSON API of the reference app: `POST /v1/evaluate`, `/healthz`, `/readyz`, `/metrics`.
//!
//! `/v1/evaluate` is the sidecar path and the hot one: the body is parsed with borrowed
//! strings (copied only when they hold escapes), the policy is found by name without
//! allocating, and a decision's response body is written by hand into one allocation of its
//! exact size (every string in it is a policy id, `[a-z0-9_-]`, or a fixed name, so nothing
//! needs escaping).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use app_bootstrap::GateRuntime;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::headers::ceil_secs;
use edge_middleware::limiter::names;
use edge_middleware::{Limiter, MAX_SUBJECT_BYTES, Member, PolicyIndex, problem};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Deserializer};
use shared_contract::{
    Cost, EvaluationId, MultiOutcome, RateLimitDecision, RateLimitOutcome, Readiness, RequestError,
};

/// What the API handlers share.
#[derive(Debug)]
pub struct ApiState {
    limiter: Option<Arc<Limiter>>,
    by_name: HashMap<Box<str>, PolicyIndex>,
    prometheus: Option<PrometheusHandle>,
    config: Option<crate::reload::ConfigView>,
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
            config: None,
        }
    }

    /// What `GET /v1/config` shows.
    #[must_use]
    pub fn with_config_view(mut self, view: crate::reload::ConfigView) -> Self {
        self.config = Some(view);
        self
    }

    /// What `GET /v1/config` shows; `None` (that route then answers 404) until
    /// [`Self::with_config_view`].
    pub fn config_view(&self) -> Option<&crate::reload::ConfigView> {
        self.config.as_ref()
    }

    /// The limiter; `None` when rate limiting is disabled.
    pub fn limiter(&self) -> Option<&Arc<Limiter>> {
        self.limiter.as_ref()
    }

    /// The policy named `name`, if the limiter has one.
    pub(crate) fn policy_index(&self, name: &str) -> Option<PolicyIndex> {
        self.by_name.get(name).copied()
    }
}

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

/// A JSON string borrowed from the body when it has no escapes, copied otherwise.
///
/// `Option<Cow<str>>` would always copy: serde borrows into a `Cow` only when the field is
/// the `Cow` itself. Refuses exactly what `String` refuses, with the same messages.
pub(crate) struct Text<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_string(Visitor)
    }
}

pub(crate) fn json(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `POST /v1/evaluate` with `{"policy"?, "subject", "cost"?, "evaluation_id"?}` (policy: the
/// default one; cost: 1), or the list form `{"requests": [...], "evaluation_id"?}`
/// ([`crate::evaluate_list`]). 200 allowed, 429 denied (both with the decision), 503 when the
/// provider could not decide and the failure policy does not let the request through, or
/// when rate limiting is disabled; 400 problem+json for a body the limiter refuses. A retry
/// with the same `evaluation_id` answers the first decision with `"replayed":true`.
pub async fn evaluate(State(state): State<Arc<ApiState>>, body: Bytes) -> Response {
    let Some(limiter) = &state.limiter else {
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

/// A body the API refuses: 400 problem+json with a stable `error` and a `detail`.
#[derive(Debug)]
pub(crate) struct Refused {
    error: &'static str,
    detail: String,
}

impl Refused {
    fn new(error: &'static str, detail: &str) -> Self {
        Self {
            error,
            detail: detail.to_owned(),
        }
    }

    pub(crate) fn response(&self) -> Response {
        problem::bad_request(self.error, &self.detail)
    }
}

impl ApiState {
    /// The policy and cost of one evaluation (`at` prefixes every problem's detail: the list
    /// form's `requests[1]: `), or the 400 that refuses it. `subject` must pass
    /// [`checked_subject`].
    pub(crate) fn admit(
        &self,
        limiter: &Limiter,
        policy: Option<&str>,
        subject: Option<&str>,
        cost: Option<i64>,
        at: &str,
    ) -> Result<(PolicyIndex, Cost), Refused> {
        let index = match policy {
            None => limiter.default_policy(),
            Some(name) => match self.by_name.get(name) {
                Some(&i) => i,
                None => {
                    return Err(Refused::new(
                        "unknown_policy",
                        &format!(
                            "{at}unknown policy {:?}",
                            name.chars().take(80).collect::<String>()
                        ),
                    ));
                }
            },
        };
        checked_subject(subject, at)?;
        let policy = limiter.policy(index);
        let policy_id = policy.id();
        let max_cost = policy.max_cost().get();
        let cost = match cost.unwrap_or(1) {
            c if c >= 1 && (c as u64) <= max_cost => Cost::new(c as u64),
            c => {
                return Err(Refused::new(
                    "invalid_cost",
                    &format!(
                        "{at}cost must be between 1 and max_cost {max_cost} of policy {policy_id}, got {c}"
                    ),
                ));
            }
        };
        match cost {
            Ok(cost) => Ok((index, cost)),
            Err(_) => Err(Refused::new(
                "invalid_cost",
                &format!("{at}cost is out of range"),
            )),
        }
    }
}

/// A subject of 1..=[`MAX_SUBJECT_BYTES`] bytes, or the 400 that refuses it (`at` prefixes
/// its detail). An empty subject is no subject (`missing_subject`), the one rule of every
/// port: gRPC refuses an empty descriptor value, and the middleware reads an empty header as
/// the absent one.
pub(crate) fn checked_subject<'s>(subject: Option<&'s str>, at: &str) -> Result<&'s str, Refused> {
    match subject {
        None => Err(Refused::new(
            "missing_subject",
            &format!("{at}subject is required"),
        )),
        Some("") => Err(Refused::new(
            "missing_subject",
            &format!("{at}subject must not be empty"),
        )),
        Some(s) if s.len() > MAX_SUBJECT_BYTES => Err(Refused::new(
            "subject_too_long",
            &format!(
                "{at}subject is {} bytes, at most {MAX_SUBJECT_BYTES} are accepted",
                s.len()
            ),
        )),
        Some(s) => Ok(s),
    }
}

/// The answer to a request the port refused (nothing was consumed): 400 with a stable
/// `error` per reason, or 503 when the provider holds as many evaluation ids as it may.
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
fn respond_replayed(limiter: &Limiter, d: &RateLimitDecision, replayed: bool) -> Response {
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

/// A decision's JSON, in one allocation of its exact size.
pub(crate) fn decision_json(d: &RateLimitDecision) -> Bytes {
    let (mut limit, mut remaining, mut retry, mut reset, mut revision) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    let parts: [&[u8]; 19] = [
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
        br#""}"#,
    ];
    let mut body = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        body.extend_from_slice(part);
    }
    // Length equal to capacity: `Bytes` takes the buffer over without a second allocation.
    Bytes::from(body)
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
    let (mut body, mut out_of_service) = match &state.limiter {
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
    if let Some(gauge) = state.limiter.as_ref().and_then(|l| l.breaker_gauge()) {
        metrics::gauge!(names::BREAKER_STATE).set(gauge);
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
    }

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
