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

use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use edge_middleware::headers::ceil_secs;
use edge_middleware::{Limiter, Member, failure, problem};
use serde::Deserialize;
use shared_contract::{
    EvaluationId, MAX_LIMITS, MultiDecision, MultiOutcome, RateLimitOutcome, RateLimitPolicy,
};

use crate::body::Text;
use crate::body::{Object, Refused};
use crate::response::{
    decision_json, json, outcome_body, push_joined, request_error, respond, shadow_json,
};
use crate::state::ApiState;

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
    entries: &[Object<Entry<'_>>],
    evaluation_id: Option<EvaluationId>,
) -> Response {
    match members(state, limiter, entries) {
        Ok(members) => evaluate_members(limiter, &members, evaluation_id).await,
        Err(refused) => refused.response(),
    }
}

/// The limits `entries` name, each checked (see the module docs); the refusal names the
/// entry.
pub(crate) fn members(
    state: &ApiState,
    limiter: &Limiter,
    entries: &[Object<Entry<'_>>],
) -> Result<Vec<Member>, Refused> {
    if entries.is_empty() {
        return Err(Refused::new(
            "no_requests",
            "requests must hold at least one entry",
        ));
    }
    if entries.len() > MAX_LIMITS {
        return Err(Refused::new(
            "too_many_limits",
            &format!(
                "requests holds {} entries, at most {MAX_LIMITS} are evaluated as one",
                entries.len()
            ),
        ));
    }
    let mut members = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let subject = e.subject.as_ref().map(|t| &*t.0);
        let policy = e.policy.as_ref().map(|t| &*t.0);
        let at = format!("requests[{i}]: ");
        let (index, cost) = state.admit(limiter, policy, subject, e.cost, &at)?;
        let subject = subject.unwrap_or_default();
        let twice = entries[..i].iter().zip(&members).position(|(earlier, m)| {
            let m: &Member = m;
            m.index == index && earlier.subject.as_ref().is_some_and(|t| t.0 == subject)
        });
        if let Some(j) = twice {
            return Err(Refused::new(
                "duplicate_limit",
                &format!(
                    "requests[{i}] repeats policy {} and subject of requests[{j}]",
                    limiter.policy(index).id()
                ),
            ));
        }
        members.push(Member {
            index,
            subject: limiter.digest(subject.as_bytes()),
            cost,
        });
    }
    Ok(members)
}

/// The answer when `members` could not be decided: the single form's answer to the failure
/// (503, or 200 when every policy fails open), by the rule of [`edge_middleware::failure`]: the
/// first policy, in request order, that does not fail open (or the first one) decides and is
/// named.
fn failed(limiter: &Limiter, members: &[Member], failure: MultiOutcome) -> Response {
    let policies: Vec<&RateLimitPolicy> = members.iter().map(|m| limiter.policy(m.index)).collect();
    match failure::failure_outcome(&policies, failure) {
        Some((_, outcome)) => respond(limiter, &outcome),
        None => problem::internal("a failure without members"),
    }
}

/// Evaluates `members` by the shadow split ([`Limiter::evaluate_split`]): the enforced ones
/// as one all-or-nothing evaluation (with `evaluation_id`), then, when the request goes
/// through, every shadow one on its own. A shadow entry never denies: its body says
/// `"shadow":true` and `would_deny`; when the enforced limits refused, it was not evaluated
/// (`"outcome":"not_evaluated"`). A retried `evaluation_id` replays the enforced limits only:
/// the shadow ones are evaluated again.
async fn evaluate_members(
    limiter: &Limiter,
    members: &[Member],
    evaluation_id: Option<EvaluationId>,
) -> Response {
    let shadow: Vec<bool> = members.iter().map(|m| limiter.is_shadow(m.index)).collect();
    let split = match limiter
        .evaluate_split(members, &shadow, evaluation_id)
        .await
    {
        Ok(split) => split,
        Err(e) => return request_error(&e),
    };
    let enforced: Vec<(usize, Member)> = members
        .iter()
        .copied()
        .enumerate()
        .filter(|(i, _)| !shadow[*i])
        .collect();
    let mut bodies: Vec<Bytes> = vec![Bytes::new(); members.len()];
    let mut decision = MultiDecision {
        allowed: true,
        decisions: Vec::new(),
        replayed: false,
    };
    let mut answer_instead = None;
    match split.enforced {
        Some(MultiOutcome::Evaluated(d)) => {
            for ((i, _), member) in enforced.iter().zip(&d.decisions) {
                bodies[*i] = decision_json(member);
            }
            decision = d;
        }
        Some(failure) => {
            let ms: Vec<Member> = enforced.iter().map(|(_, m)| *m).collect();
            let response = failed(limiter, &ms, failure);
            if !split.through {
                return response;
            }
            // Failed open: the request goes through, so the shadow limits count it.
            answer_instead = Some(response);
        }
        None => {}
    }
    if split.through {
        for (i, outcome) in split.shadow {
            bodies[i] = match outcome {
                Ok(RateLimitOutcome::Evaluated(d)) => shadow_json(&d),
                Ok(other) => outcome_body(limiter, &other).2,
                Err(e) => return request_error(&e),
            };
        }
    } else {
        for (i, m) in members.iter().enumerate().filter(|(i, _)| shadow[*i]) {
            bodies[i] = Bytes::from(format!(
                r#"{{"outcome":"not_evaluated","policy":"{}","shadow":true}}"#,
                limiter.policy(m.index).id()
            ));
        }
    }
    answer_instead.unwrap_or_else(|| decided(&decision, &bodies))
}

/// The list form's answer to a decision: `bodies`, one per entry in order, are the
/// decisions' JSON (`d` tells allowed, violated and replayed; its decisions are the enforced
/// entries').
pub(crate) fn decided(d: &MultiDecision, bodies: &[Bytes]) -> Response {
    let mut body = String::with_capacity(64 + 256 * bodies.len());
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
    push_joined(&mut body, bodies);
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
