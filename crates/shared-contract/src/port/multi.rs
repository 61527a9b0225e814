//! Several limits of one caller request, decided as one: allowed only when every limit admits,
//! and then every limit is charged; when any limit denies, nothing is charged anywhere.
//!
//! A [`MultiRequest`] holds 1..=[`MAX_LIMITS`] [`Limit`]s with distinct `(policy, subject)`
//! pairs (a pair twice would be one key charged twice, in an order-dependent way) and an
//! optional [`EvaluationId`]: a retry with the same id and the same limits, within the replay
//! window, answers the first decision again and charges nothing more.
//!
//! The reference semantics is [`crate::model::multi::evaluate_all`], a pure function over the
//! single-policy models.

use super::{RateLimitRequest, RequestError};
use crate::decision::UnavailableCategory;
use crate::decision::{IncompatibleCategory, Outcome, RateLimitDecision, RateLimitOutcome};
use crate::ids::{Cost, Deadline, EvaluationId, PolicyId, SubjectDigest};
use crate::policy::RateLimitPolicy;

/// Most limits in one all-or-nothing evaluation.
pub const MAX_LIMITS: usize = 8;

/// Shortest replay window of an evaluation id (ms): long enough for a client's retry even
/// when every limit of the evaluation has a very short window.
pub const MIN_REPLAY_WINDOW_MS: u64 = 1_000;
/// Longest replay window of an evaluation id (ms): one day, so the memory an id holds is
/// bounded in time whatever the policies' windows are.
pub const MAX_REPLAY_WINDOW_MS: u64 = 86_400_000;

/// One limit of a multi-limit evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The policy this limit applies.
    pub policy_id: PolicyId,
    /// The subject this limit counts for.
    pub subject: SubjectDigest,
    /// What this request costs against this limit; at most the policy's `max_cost`.
    pub cost: Cost,
}

/// The limits of one caller request: 1..=[`MAX_LIMITS`], no `(policy, subject)` pair twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits(Vec<Limit>);

impl Limits {
    /// # Errors
    /// [`RequestError::NoLimits`], [`RequestError::TooManyLimits`] or
    /// [`RequestError::DuplicateLimit`]; nothing is evaluated.
    pub fn new(limits: Vec<Limit>) -> Result<Self, RequestError> {
        if limits.is_empty() {
            return Err(RequestError::NoLimits);
        }
        if limits.len() > MAX_LIMITS {
            return Err(RequestError::TooManyLimits {
                got: limits.len(),
                max: MAX_LIMITS,
            });
        }
        for (i, a) in limits.iter().enumerate() {
            if limits[..i]
                .iter()
                .any(|b| b.policy_id == a.policy_id && b.subject == a.subject)
            {
                return Err(RequestError::DuplicateLimit {
                    policy_id: a.policy_id.clone(),
                });
            }
        }
        Ok(Self(limits))
    }

    /// The limits, in request order.
    pub fn as_slice(&self) -> &[Limit] {
        &self.0
    }

    /// How many limits: `1..=MAX_LIMITS`.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a `Limits` holds at least one limit.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The limits, in request order.
    pub fn iter(&self) -> std::slice::Iter<'_, Limit> {
        self.0.iter()
    }
}

/// Several limits of one caller request, decided as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiRequest {
    /// The limits to decide together.
    pub limits: Limits,
    /// A retry with the same id and limits within the replay window answers the first
    /// decision and charges nothing more.
    pub evaluation_id: Option<EvaluationId>,
    /// When the caller needs the answer by.
    pub deadline: Deadline,
}

impl MultiRequest {
    /// The one-limit evaluation standing for `request` (for providers that answer an
    /// evaluation id through the multi-limit path).
    pub fn single(request: RateLimitRequest) -> Self {
        Self {
            limits: Limits(vec![Limit {
                policy_id: request.policy_id,
                subject: request.subject,
                cost: request.cost,
            }]),
            evaluation_id: request.evaluation_id,
            deadline: request.deadline,
        }
    }
}

/// How long an evaluation id of these policies is remembered: the longest reset horizon among
/// them (after it, a retry could not have been answered differently anyway), within
/// [`MIN_REPLAY_WINDOW_MS`]..=[`MAX_REPLAY_WINDOW_MS`].
pub fn replay_window_ms<'a>(policies: impl IntoIterator<Item = &'a RateLimitPolicy>) -> u64 {
    policies
        .into_iter()
        .map(|p| p.algorithm().reset_horizon_ms())
        .max()
        .unwrap_or(0)
        .clamp(MIN_REPLAY_WINDOW_MS, MAX_REPLAY_WINDOW_MS)
}

/// The decision of a multi-limit evaluation.
///
/// `decisions` has one entry per limit, in request order: each is exactly what that limit's
/// single-policy model answered at the evaluation's time. When `allowed` is false nothing was
/// charged; members that would have admitted still say `allowed: true`, with the figures they
/// would have had after the charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiDecision {
    /// Whether every limit admitted, and so every limit was charged; `false` charged nothing.
    pub allowed: bool,
    /// One decision per limit, in request order.
    pub decisions: Vec<RateLimitDecision>,
    /// This answer is the stored first decision of a retried evaluation id: nothing was
    /// evaluated or charged now.
    pub replayed: bool,
}

impl MultiDecision {
    /// The limits that denied, in request order.
    pub fn violated(&self) -> impl Iterator<Item = &RateLimitDecision> {
        self.decisions.iter().filter(|d| !d.allowed)
    }
}

/// The honest result of a multi-limit evaluation, as [`RateLimitOutcome`] is for one limit
/// (the same failures). The failures concern the whole evaluation and name the limit they
/// arose at (the first one when it is not known).
pub type MultiOutcome = Outcome<MultiDecision>;

impl MultiOutcome {
    /// The single outcome of a one-limit evaluation of `policy_id` (a replay is reported as
    /// the decision it replays).
    pub fn into_single(self, policy_id: &PolicyId) -> RateLimitOutcome {
        match self.decided() {
            Ok(mut d) => match d.decisions.drain(..).next() {
                Some(first) => RateLimitOutcome::Evaluated(first),
                // A decision always has one entry per limit; a limit set is never empty.
                None => RateLimitOutcome::Incompatible {
                    policy_id: policy_id.clone(),
                    category: IncompatibleCategory::Reply,
                },
            },
            Err(failure) => failure,
        }
    }

    /// The outcome of a one-limit evaluation whose single outcome is `outcome` (the inverse
    /// of [`Self::into_single`]): a decision becomes a one-member decision.
    pub fn from_single(outcome: RateLimitOutcome) -> Self {
        outcome.map(|d| MultiDecision {
            allowed: d.allowed,
            decisions: vec![d],
            replayed: false,
        })
    }

    /// Joins per-limit outcomes into one: the first non-decision, else a decision allowed
    /// when every member allowed.
    ///
    /// This does not make anything atomic: it is for ports whose members cannot have been
    /// charged partially (test doubles that charge nothing, a provider that decided them
    /// together).
    pub fn combine(outcomes: impl IntoIterator<Item = RateLimitOutcome>) -> Self {
        let mut decisions = Vec::new();
        for outcome in outcomes {
            match outcome.decided() {
                Ok(d) => decisions.push(d),
                Err(failure) => return failure,
            }
        }
        MultiOutcome::Evaluated(MultiDecision {
            allowed: decisions.iter().all(|d| d.allowed),
            decisions,
            replayed: false,
        })
    }

    /// An unavailable outcome for the whole evaluation.
    pub fn unavailable(policy_id: PolicyId, category: UnavailableCategory) -> Self {
        MultiOutcome::Unavailable {
            policy_id,
            retry_after_ms: 0,
            category,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::UnavailableCategory;

    #[test]
    fn a_single_outcome_and_its_one_limit_evaluation_convert_both_ways() {
        let id = PolicyId::new("p").expect("valid id");
        let failures = [
            RateLimitOutcome::Unavailable {
                policy_id: id.clone(),
                retry_after_ms: 7,
                category: UnavailableCategory::Connect,
            },
            RateLimitOutcome::Indeterminate {
                policy_id: id.clone(),
                retry_after_ms: 9,
            },
            RateLimitOutcome::Incompatible {
                policy_id: id.clone(),
                category: IncompatibleCategory::Reply,
            },
        ];
        for outcome in failures {
            let multi = MultiOutcome::from_single(outcome.clone());
            assert_eq!(multi.name(), outcome.name());
            assert_eq!(multi.into_single(&id), outcome);
        }
    }
}
