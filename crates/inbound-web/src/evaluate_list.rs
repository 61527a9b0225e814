//! The list form of `POST /v1/evaluate`: several limits decided as one, all-or-nothing.
//!
//! `{"requests":[{"policy":"user","subject":"u-1","cost":1},{"policy":"tenant","subject":"t-9"}],
//! "evaluation_id":"optional"}` is answered
//! `{"outcome":"evaluated","allowed":false,"violated_policies":["tenant"],"decisions":[...]}`:
//! one single-form decision body per entry, in order; 200 when every limit allowed (then every
//! one was charged), 429 when any denied (then none was), with `Retry-After` the latest retry
//! among the violated policies; `"replayed":true` when it is the stored answer of a retried
//! `evaluation_id`. An outcome that is not a decision is answered as the single form answers
//! it (503, or 200 under `fail_open`), naming the policy it arose at.
//!
//! Every entry is checked before anything is evaluated (1..=[`MAX_LIMITS`] entries, each a
//! known policy, a subject, a cost within the policy's `max_cost`, no policy and subject
//! twice): a refusal is 400 problem+json naming the entry, and nothing is charged.

use std::fmt::Write as _;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::headers::ceil_secs;
use edge_middleware::{Limiter, Member, problem};
use serde::Deserialize;
use shared_contract::{EvaluationId, MAX_LIMITS, MultiDecision, MultiOutcome};

use crate::api::{ApiState, Text, decision_json, json, request_error, respond};

/// One entry of `requests`: the single form's fields.
#[derive(Deserialize)]
pub(crate) struct Entry<'a> {
    #[serde(borrow, default)]
    policy: Option<Text<'a>>,
    #[serde(borrow, default)]
    subject: Option<Text<'a>>,
    #[serde(default)]
    cost: Option<i64>,
}

/// Evaluates `entries` as one (see the module docs).
pub(crate) async fn evaluate(
    state: &ApiState,
    limiter: &Limiter,
    entries: &[Entry<'_>],
    evaluation_id: Option<EvaluationId>,
) -> Response {
    if entries.is_empty() {
        return problem::bad_request("no_requests", "requests must hold at least one entry");
    }
    if entries.len() > MAX_LIMITS {
        return problem::bad_request(
            "too_many_limits",
            &format!(
                "requests holds {} entries, at most {MAX_LIMITS} are evaluated as one",
                entries.len()
            ),
        );
    }
    let mut members = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let subject = e.subject.as_ref().map(|t| &*t.0);
        let policy = e.policy.as_ref().map(|t| &*t.0);
        let at = format!("requests[{i}]: ");
        let (index, cost) = match state.admit(limiter, policy, subject, e.cost, &at) {
            Ok(admitted) => admitted,
            Err(refused) => return refused.response(),
        };
        let subject = subject.unwrap_or_default();
        let twice = entries[..i].iter().zip(&members).position(|(earlier, m)| {
            let m: &Member = m;
            m.index == index && earlier.subject.as_ref().is_some_and(|t| t.0 == subject)
        });
        if let Some(j) = twice {
            return problem::bad_request(
                "duplicate_limit",
                &format!(
                    "requests[{i}] repeats policy {} and subject of requests[{j}]",
                    limiter.policy(index).id()
                ),
            );
        }
        members.push(Member {
            index,
            subject: limiter.digest(subject.as_bytes()),
            cost,
        });
    }
    match limiter.evaluate_all(&members, evaluation_id).await {
        Ok(MultiOutcome::Evaluated(d)) => decided(&d),
        Ok(failure) => {
            // 200 under fail_open only when every policy fails open: the answer names the
            // first one that does not (or the first one), whose failure policy decides.
            let named = members
                .iter()
                .map(|m| limiter.policy(m.index).id())
                .find(|id| !limiter.fails_open(id))
                .unwrap_or(limiter.policy(members[0].index).id());
            let failure = match failure {
                MultiOutcome::Unavailable {
                    retry_after_ms,
                    category,
                    ..
                } => MultiOutcome::Unavailable {
                    policy_id: named.clone(),
                    retry_after_ms,
                    category,
                },
                MultiOutcome::Indeterminate { retry_after_ms, .. } => MultiOutcome::Indeterminate {
                    policy_id: named.clone(),
                    retry_after_ms,
                },
                MultiOutcome::Incompatible { category, .. } => MultiOutcome::Incompatible {
                    policy_id: named.clone(),
                    category,
                },
                evaluated => evaluated,
            };
            respond(limiter, &failure.into_single(named))
        }
        Err(e) => request_error(&e),
    }
}

/// The list form's answer to a decision.
fn decided(d: &MultiDecision) -> Response {
    let mut body = String::with_capacity(64 + 256 * d.decisions.len());
    let _ = write!(
        body,
        r#"{{"outcome":"evaluated","allowed":{},"violated_policies":["#,
        d.allowed
    );
    for (i, v) in d.violated().enumerate() {
        if i > 0 {
            body.push(',');
        }
        // Policy ids are [a-z0-9_-]: JSON strings without escapes.
        let _ = write!(body, "\"{}\"", v.policy_id);
    }
    body.push_str(r#"],"decisions":["#);
    for (i, member) in d.decisions.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&String::from_utf8_lossy(&decision_json(member)));
    }
    body.push(']');
    if d.replayed {
        body.push_str(r#","replayed":true"#);
    }
    body.push('}');
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut r = json(status, body);
    let retry_ms = d
        .violated()
        .map(|v| v.retry_after_ms.max(1))
        .max()
        .unwrap_or(0);
    if !d.allowed {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(ceil_secs(retry_ms).max(1)),
        );
    }
    r
}
