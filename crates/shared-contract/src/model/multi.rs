//! The reference semantics of a multi-limit evaluation: every limit is evaluated by its own
//! single-policy model at the same clock reading; the evaluation admits only when every limit
//! admits, and only then is any state written.
//!
//! - Each member's [`Evaluation`] is exactly what [`super::evaluate`] answers for it alone
//!   (its own clock rule, its own figures); only its `new_state` is dropped when the
//!   evaluation as a whole does not admit.
//! - A member whose clock reading is unsafe makes the whole evaluation [`MultiVerdict::ClockUnsafe`]
//!   (nothing is written, as for one limit).
//! - A member the model refuses (state of another algorithm, a cost above `max_cost`) refuses
//!   the whole evaluation: [`MemberError`] names it; nothing is written.

use crate::decision::Source;
use crate::ids::Cost;
use crate::multi::MultiDecision;
use crate::policy::RateLimitPolicy;

use super::reserve::{self, Hold, Settlement};
use super::{AlgorithmState, Evaluation, ModelError, Verdict};

/// One limit as the model takes it: its policy, its stored state and the cost.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// The limit's policy.
    pub policy: &'a RateLimitPolicy,
    /// The limit's stored state; `None` when there is none (a fresh or forgotten subject).
    pub state: Option<&'a AlgorithmState>,
    /// What the request costs against this limit.
    pub cost: Cost,
}

/// The verdict of a multi-limit evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiVerdict {
    /// Every member admitted: every `new_state` is to be written.
    Allowed,
    /// At least one member denied: nothing is written.
    Denied,
    /// The member at `index` (the first such) saw the clock too far behind its state;
    /// nothing is written.
    ClockUnsafe {
        /// Position of that member, from 0.
        index: usize,
    },
}

/// The result of a multi-limit evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiEvaluation {
    /// Allowed, denied, or refused for an unsafe clock.
    pub verdict: MultiVerdict,
    /// One evaluation per member, in order; `new_state` is `Some` only when the verdict is
    /// `Allowed`.
    pub members: Vec<Evaluation<AlgorithmState>>,
}

/// A member the model refused, by position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit {index}: {error}")]
pub struct MemberError {
    /// Position of the refused member, from 0.
    pub index: usize,
    /// Why the model refused it.
    pub error: ModelError,
}

/// Evaluates every member at `now_ms`; see the module docs.
///
/// # Errors
/// [`MemberError`] for the first member the single model refuses.
pub fn evaluate_all(members: &[Member<'_>], now_ms: u64) -> Result<MultiEvaluation, MemberError> {
    all::<true>(members, now_ms)
}

/// [`evaluate_all`] without the writes' expiries, each member as [`super::decide`] answers.
///
/// # Errors
/// As [`evaluate_all`].
pub fn decide_all(members: &[Member<'_>], now_ms: u64) -> Result<MultiEvaluation, MemberError> {
    all::<false>(members, now_ms)
}

/// [`evaluate_all`] (`EXPIRY`) or [`decide_all`], as the single model is generic.
fn all<const EXPIRY: bool>(
    members: &[Member<'_>],
    now_ms: u64,
) -> Result<MultiEvaluation, MemberError> {
    let mut evaluations = Vec::with_capacity(members.len());
    for (index, m) in members.iter().enumerate() {
        let evaluation = super::evaluate_as::<EXPIRY>(m.policy, m.state, now_ms, m.cost)
            .map_err(|error| MemberError { index, error })?;
        evaluations.push(evaluation);
    }
    let verdict = if let Some(index) = evaluations
        .iter()
        .position(|e| e.verdict == Verdict::ClockUnsafe)
    {
        MultiVerdict::ClockUnsafe { index }
    } else if evaluations.iter().all(|e| e.verdict == Verdict::Allowed) {
        MultiVerdict::Allowed
    } else {
        MultiVerdict::Denied
    };
    if verdict != MultiVerdict::Allowed {
        for e in &mut evaluations {
            e.new_state = None;
            e.ttl_ms = 0;
            e.keeps_expiry = false;
        }
    }
    Ok(MultiEvaluation {
        verdict,
        members: evaluations,
    })
}

/// Reserves every member's cost as its estimate, all or nothing: the multi-limit evaluation,
/// and one hold per member when it admitted.
///
/// # Errors
/// [`MemberError`] for the first member the model refuses, or whose algorithm takes no
/// reservations (checked before any is evaluated).
pub fn reserve_all(
    members: &[Member<'_>],
    now_ms: u64,
) -> Result<(MultiEvaluation, Option<Vec<Hold>>), MemberError> {
    for (index, m) in members.iter().enumerate() {
        reserve::supported(m.policy).map_err(|error| MemberError { index, error })?;
    }
    let evaluation = evaluate_all(members, now_ms)?;
    let holds = (evaluation.verdict == MultiVerdict::Allowed).then(|| {
        members
            .iter()
            .zip(&evaluation.members)
            .map(|(m, e)| Hold {
                at_ms: e.effective_now_ms,
                estimate: m.cost.get(),
            })
            .collect()
    });
    Ok((evaluation, holds))
}

/// One member of a settlement: its policy, its stored state, its hold and its actual cost.
#[derive(Debug, Clone, Copy)]
pub struct Settle<'a> {
    /// The limit's policy.
    pub policy: &'a RateLimitPolicy,
    /// The limit's stored state.
    pub state: Option<&'a AlgorithmState>,
    /// What the reservation holds against it.
    pub hold: &'a Hold,
    /// The actual cost (0 cancels).
    pub actual: u64,
}

/// Settles every member at `now_ms`, all or nothing: when any member sees the clock too far
/// behind its state, no member writes (the reservation stays outstanding).
///
/// # Errors
/// [`MemberError`] for the first member the model refuses.
pub fn settle_all(
    members: &[Settle<'_>],
    now_ms: u64,
) -> Result<Vec<Settlement<AlgorithmState>>, MemberError> {
    let mut settlements = Vec::with_capacity(members.len());
    for (index, m) in members.iter().enumerate() {
        let s = reserve::settle(m.policy, m.state, now_ms, m.hold, m.actual)
            .map_err(|error| MemberError { index, error })?;
        settlements.push(s);
    }
    if settlements
        .iter()
        .any(|s| s.evaluation.verdict == Verdict::ClockUnsafe)
    {
        for s in &mut settlements {
            s.evaluation.new_state = None;
            s.evaluation.ttl_ms = 0;
            s.evaluation.keeps_expiry = false;
        }
    }
    Ok(settlements)
}

impl MultiEvaluation {
    /// The decision this evaluation stands for (`policies` in member order); `None` for
    /// `ClockUnsafe`.
    pub fn decision<'a>(
        &self,
        policies: impl IntoIterator<Item = &'a RateLimitPolicy>,
        source: Source,
    ) -> Option<MultiDecision> {
        let allowed = match self.verdict {
            MultiVerdict::Allowed => true,
            MultiVerdict::Denied => false,
            MultiVerdict::ClockUnsafe { .. } => return None,
        };
        let decisions = self
            .members
            .iter()
            .zip(policies)
            .map(|(e, p)| e.decision(p, source))
            .collect::<Option<Vec<_>>>()?;
        Some(MultiDecision {
            allowed,
            decisions,
            replayed: false,
        })
    }
}
