//! What a denial proves: the rule the exact denial cache rests on.
//!
//! A denial of cost `c` at server time `T` with `retry_after = R` means that no request of cost
//! `>= c` for the same key, policy and revision is admitted at any server time before `T + R`,
//! whatever other instances do meanwhile. Other instances can only consume, and for every rate
//! algorithm consumption never raises what is available later:
//!
//! - `retry_after` is computed from the effective time `E >= T` (the clock rule clamps a
//!   regressed clock up to the state's last write), so `T + R <= E + R`;
//! - without other requests, `R` is the exact earliest wait after which `c` fits (property
//!   `after_retry_after_a_denied_request_alone_is_allowed_and_not_before`), and a larger cost
//!   fits no earlier;
//! - an admission only adds to what is counted (a window's count, a log entry, a bucket's
//!   spent tokens, a GCRA debt), so it can only delay that point;
//! - a server time before `T` computes with a time no earlier than the state's last write
//!   (clamped or refused as `CLOCK_UNSAFE`), where no more is available than at `T`.
//!
//! `tests/it/denial_properties.rs` checks this for every rate algorithm over any reachable state,
//! any interleaving of other consumers and any server time before `T + R`. Concurrency
//! policies are not cached: a release frees a slot at any time, so a denial bounds nothing.
//!
//! What a cache may answer from a bound is [`DenialBound::answer`]: a denial for any cost
//! `>= c` until `R` has elapsed, whose `retry_after` is the rest of `R`. It never waits longer
//! than the model would. `remaining` and `reset_at` are those the denial reported: time may
//! have raised `remaining` since, and other instances lowered it.

use crate::decision::{RateLimitDecision, Source};
use crate::ids::Cost;
use crate::policy::{AlgorithmKind, RateLimitPolicy};

use super::Evaluation;

/// What one denial proves about the requests after it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenialBound {
    /// The denied cost: every request of this cost or more is denied while the bound holds.
    pub cost: u64,
    /// How long after the denial's server time the bound holds (its `retry_after`).
    pub retry_after_ms: u64,
    /// The figures the denial reported.
    pub limit: u64,
    /// The `remaining` the denial reported.
    pub remaining: u64,
    /// The `reset_at_ms` the denial reported (Unix ms).
    pub reset_at_ms: u64,
}

impl DenialBound {
    /// The bound `evaluation` of `cost` under `policy` proves, or `None` when it proves nothing
    /// worth keeping: not a denial, a `retry_after` of 0, or a concurrency policy.
    pub fn of<S>(policy: &RateLimitPolicy, evaluation: &Evaluation<S>, cost: Cost) -> Option<Self> {
        // The source names no one here: only the decision's figures are read.
        let decision = evaluation.decision(policy, Source::GlobalRedis)?;
        Self::of_decision(policy, &decision, cost)
    }

    /// The bound a provider's `decision` of `cost` proves (see [`Self::of`]), for a decision of
    /// `policy`'s current revision.
    pub fn of_decision(
        policy: &RateLimitPolicy,
        decision: &RateLimitDecision,
        cost: Cost,
    ) -> Option<Self> {
        let cached = !decision.allowed
            && decision.retry_after_ms > 0
            && decision.revision == policy.revision()
            && policy.kind() != AlgorithmKind::Concurrency;
        cached.then_some(DenialBound {
            cost: cost.get(),
            retry_after_ms: decision.retry_after_ms,
            limit: decision.limit,
            remaining: decision.remaining,
            reset_at_ms: decision.reset_at_ms,
        })
    }

    /// Whether the bound denies `cost` once `elapsed_ms` have passed since the denial.
    pub fn covers(&self, elapsed_ms: u64, cost: u64) -> bool {
        cost >= self.cost && elapsed_ms < self.retry_after_ms
    }

    /// The denial the bound answers for `cost` after `elapsed_ms`, from `source`, or `None`
    /// when it does not cover that request ([`Self::covers`]).
    pub fn answer(
        &self,
        policy: &RateLimitPolicy,
        elapsed_ms: u64,
        cost: Cost,
        source: Source,
    ) -> Option<RateLimitDecision> {
        self.covers(elapsed_ms, cost.get())
            .then(|| RateLimitDecision {
                allowed: false,
                limit: self.limit,
                remaining: self.remaining,
                retry_after_ms: self.retry_after_ms - elapsed_ms,
                reset_at_ms: self.reset_at_ms,
                policy_id: policy.id().clone(),
                revision: policy.revision(),
                source,
                certainty: policy.kind().certainty(),
                fleet: None,
            })
    }
}
