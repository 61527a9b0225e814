//! The in-memory rate-limit provider: the reference semantics of `shared-contract`, run on
//! state held in this process.
//!
//! The key design decision: **this crate implements no algorithm.** Every decision is
//! [`shared_contract::model::evaluate`] applied to the key's stored state under a key-level
//! lock, so the local provider decides exactly like the reference models (and so like the
//! Redis programs that mirror them), and two concurrent evaluations of one key never both see
//! the same state.
//!
//! # Keys, expiry and eviction
//!
//! State is keyed by (policy id, policy revision, subject digest): each policy of the
//! provider's [`PolicySet`] gets its own slot, and a slot fixes id and revision, so a new
//! revision never reads an old revision's state.
//!
//! An entry expires [`RateLimitPolicy::state_lifetime_ms`] (the algorithm's reset horizon plus
//! the policy's cleanup grace) plus `max_clock_regression` after its last write. State that
//! old decides exactly like no state, so **expiry never changes a decision**; it only returns
//! memory. (The margin of `max_clock_regression` covers a wall clock stepped back within the
//! policy's tolerance, during which old state still matters.)
//!
//! At most [`LocalSettings::max_keys`] keys are held, across all policies. When more subjects
//! are active, moka evicts entries (TinyLFU: keys seen often are kept, one-off keys go first).
//! **Eviction means forgetting**: an evicted key that comes back starts from empty state, so
//! it may be admitted up to a fresh quota again. Over-admission is bounded by one quota per
//! eviction of that key, and happens only when more than `max_keys` keys are live at once;
//! size `max_keys` above the number of subjects active within a state lifetime to avoid it.
//!
//! # Sources and certainty
//!
//! [`LocalProvider::new`] reports `source = local` and the algorithm's own certainty
//! (`approximate_algorithm` for the sliding-window counter, `certain` otherwise: this process
//! is the whole state). [`LocalProvider::fallback`] is the per-instance stand-in for an
//! unavailable global provider: `source = local_fallback`, `certainty = approximate_fallback`
//! (N instances may admit up to N times the limit).
//!
//! The local provider does not deduplicate evaluations: a request with an `evaluation_id` is
//! refused with [`RequestError::EvaluationIdUnsupported`].
//!
//! # Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

mod store;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::{
    Certainty, Clock, EdgeRateLimitPort, IncompatibleCategory, PolicyId, PolicySet,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, RequestError, Source, UnavailableCategory,
};

use store::{Key, Store};

/// Tunables of the local provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSettings {
    /// Most keys (policy, revision, subject) held at once, across all policies. Beyond it,
    /// keys are evicted and start fresh when they return (see the crate docs). 0 holds nothing:
    /// every request is decided on empty state.
    pub max_keys: u64,
}

impl Default for LocalSettings {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
        }
    }
}

/// The in-memory provider. See the crate docs.
pub struct LocalProvider {
    policies: PolicySet,
    slots: HashMap<PolicyId, u32>,
    clock: Arc<dyn Clock>,
    store: Store,
    source: Source,
    /// `Some` overrides the algorithm's certainty (the fallback's `approximate_fallback`).
    certainty: Option<Certainty>,
    max_keys: u64,
}

impl fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalProvider")
            .field("policies", &self.slots.keys().collect::<Vec<_>>())
            .field("clock", &self.clock)
            .field("source", &self.source)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl LocalProvider {
    /// A provider of `policies` reading time from `clock`; decisions report `source = local`
    /// and the algorithm's certainty.
    pub fn new(policies: PolicySet, clock: Arc<dyn Clock>, settings: LocalSettings) -> Self {
        Self::build(policies, clock, settings, Source::Local, None)
    }

    /// Same as [`Self::new`], but decisions report `source = local_fallback` and
    /// `certainty = approximate_fallback`: the stand-in for an unavailable global provider.
    pub fn fallback(policies: PolicySet, clock: Arc<dyn Clock>, settings: LocalSettings) -> Self {
        Self::build(
            policies,
            clock,
            settings,
            Source::LocalFallback,
            Some(Certainty::ApproximateFallback),
        )
    }

    fn build(
        policies: PolicySet,
        clock: Arc<dyn Clock>,
        settings: LocalSettings,
        source: Source,
        certainty: Option<Certainty>,
    ) -> Self {
        let mut slots = HashMap::new();
        let mut lifetimes = Vec::new();
        for (slot, policy) in (0u32..).zip(policies.iter()) {
            slots.insert(policy.id().clone(), slot);
            lifetimes.push(entry_lifetime(policy));
        }
        Self {
            store: Store::new(settings.max_keys, lifetimes),
            policies,
            slots,
            clock,
            source,
            certainty,
            max_keys: settings.max_keys,
        }
    }

    /// Evaluates one request now, without an executor: the same code the port runs (the port
    /// never waits, so its future completes on first poll).
    ///
    /// # Errors
    /// [`RequestError`] for an evaluation id, an unknown policy or a cost above `max_cost`;
    /// nothing is consumed.
    pub fn evaluate_now(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitOutcome, RequestError> {
        if request.evaluation_id.is_some() {
            return Err(RequestError::EvaluationIdUnsupported);
        }
        let policy = self.policies.admit(request)?;
        let Some(&slot) = self.slots.get(policy.id()) else {
            // Every policy of the set got a slot at construction.
            return Err(RequestError::UnknownPolicy(request.policy_id.clone()));
        };
        // A caller whose deadline has passed no longer waits for the answer: consuming quota
        // for it would only take quota from its retry.
        if request.deadline.remaining_from(Instant::now()).is_zero() {
            return Ok(RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after_ms: 0,
                category: UnavailableCategory::Deadline,
            });
        }
        let key = Key {
            slot,
            subject: *request.subject.as_bytes(),
        };
        let cost = request.cost;
        let clock = &self.clock;
        let evaluation = self.store.update(key, |state| {
            // Time is read under the key lock, so the evaluations of one key see
            // non-decreasing times in the order they are serialized.
            match model::evaluate(policy, state, clock.now_ms(), cost) {
                Ok(mut evaluation) => (evaluation.new_state.take(), Ok(evaluation)),
                Err(e) => (None, Err(e)),
            }
        });
        Ok(match evaluation {
            Some(Ok(evaluation)) => self.outcome(policy, &evaluation),
            Some(Err(_)) | None => RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                category: IncompatibleCategory::State,
            },
        })
    }

    fn outcome(
        &self,
        policy: &RateLimitPolicy,
        evaluation: &model::Evaluation<AlgorithmState>,
    ) -> RateLimitOutcome {
        match (evaluation.verdict, evaluation.decision(policy, self.source)) {
            (Verdict::Allowed | Verdict::Denied, Some(mut decision)) => {
                if let Some(certainty) = self.certainty {
                    decision.certainty = certainty;
                }
                RateLimitOutcome::Evaluated(decision)
            }
            // The clock went back beyond the policy's tolerance: nothing was written.
            _ => RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after_ms: evaluation.retry_after_ms,
                category: UnavailableCategory::Clock,
            },
        }
    }

    /// Keys held now (after pending evictions and expiries are applied); at most `max_keys`.
    pub fn stored_keys(&self) -> u64 {
        self.store.len()
    }
}

/// How long an entry of `policy` is kept after its last write. See the crate docs.
fn entry_lifetime(policy: &RateLimitPolicy) -> Duration {
    Duration::from_millis(
        policy
            .state_lifetime_ms()
            .saturating_add(policy.max_clock_regression_ms()),
    )
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for LocalProvider {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        self.evaluate_now(&request)
    }

    fn policies(&self) -> &PolicySet {
        &self.policies
    }
}

#[cfg(test)]
mod tests;
