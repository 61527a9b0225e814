//! Descriptors of rules that charge after the work (`charge = "after"`): Envoy's stream-done
//! call (`apply_on_stream_done`) carries the cost the response reported (LLM tokens, from
//! dynamic metadata) in `hits_addend`, and ignores the answer, so that charge must stick.
//!
//! - The cost is the descriptor's own `hits_addend` when set, else the request's, and **0
//!   stays 0** (elsewhere 0 means 1).
//! - Cost 0 is a **check**: admitted while a cost of 1 would be, nothing charged; a check
//!   that denies refuses the request (`OVER_LIMIT`), and the other limits are not evaluated.
//! - Any other cost is **charged past the limit if need be** (an overdraft that denies later
//!   requests until paid down); never denied. Above the policy's `max_cost` it is refused
//!   (`INVALID_ARGUMENT`) and so lost: size `max_cost` for the largest response.
//! - Descriptors with the same policy and values are one limit charged their summed cost.

use edge_middleware::{Limiter, PolicyIndex};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use shared_contract::{
    MAX_LIMITS, MultiOutcome, Outcome, RateLimitDecision, RateLimitPolicy, SubjectDigest,
};
use tonic::Status;

/// One limit charged after the work, and the descriptors that name it.
#[derive(Debug, Clone)]
pub(crate) struct After {
    pub(crate) index: PolicyIndex,
    subject: SubjectDigest,
    cost: u64,
    descriptors: Vec<usize>,
}

/// The cost of descriptor `d` of a rule that charges after the work.
pub(crate) fn cost(d: &RateLimitDescriptor, request_level: u32) -> u64 {
    d.hits_addend.map_or(u64::from(request_level), |h| h.value)
}

/// Adds descriptor `i` (`(policy, subject, cost)`) to `after`, merging it with an earlier
/// one of the same limit; which limit it is.
pub(crate) fn add(
    after: &mut Vec<After>,
    i: usize,
    (index, subject, cost): (PolicyIndex, SubjectDigest, u64),
    policy: &RateLimitPolicy,
) -> Result<usize, Status> {
    let max = policy.max_cost().get();
    let j = match after
        .iter()
        .position(|a| a.index == index && a.subject == subject)
    {
        Some(j) => {
            after[j].cost = after[j].cost.saturating_add(cost);
            after[j].descriptors.push(i);
            j
        }
        None => {
            if after.len() == MAX_LIMITS {
                return Err(Status::invalid_argument(format!(
                    "more than {MAX_LIMITS} descriptors match rules that charge after the work"
                )));
            }
            after.push(After {
                index,
                subject,
                cost,
                descriptors: vec![i],
            });
            after.len() - 1
        }
    };
    if after[j].cost > max {
        let names: Vec<String> = after[j]
            .descriptors
            .iter()
            .map(|i| format!("descriptors[{i}]"))
            .collect();
        return Err(Status::invalid_argument(format!(
            "{}: hits_addend {} is above max_cost {max} of policy {}; nothing was charged",
            names.join(" and "),
            after[j].cost,
            policy.id()
        )));
    }
    Ok(j)
}

/// Why the limits charged after the work have no decisions.
pub(crate) enum Refused {
    /// A request the port refused.
    Status(Status),
    /// The provider could not answer.
    Failed(MultiOutcome),
}

/// Checks and charges `after`: one decision per limit, in order.
pub(crate) async fn charge(
    limiter: &Limiter,
    after: &[After],
) -> Result<Vec<RateLimitDecision>, Refused> {
    if after.is_empty() {
        return Ok(Vec::new());
    }
    let limits: Vec<_> = after.iter().map(|a| (a.index, a.subject, a.cost)).collect();
    match limiter.charge(&limits).await {
        Ok(Outcome::Evaluated(d)) => Ok(d.decisions),
        Ok(failure) => Err(Refused::Failed(failure)),
        Err(e @ shared_contract::RequestError::ChargesUnsupported) => {
            Err(Refused::Status(Status::unimplemented(e.to_string())))
        }
        Err(e) => Err(Refused::Status(Status::invalid_argument(e.to_string()))),
    }
}
