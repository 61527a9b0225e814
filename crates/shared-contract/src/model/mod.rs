//! The reference semantics: one pure function per algorithm,
//! `(params, rules, state, now_ms, cost) -> Evaluation { new_state, decision fields }`.
//!
//! These functions are the oracle. The local provider calls them directly; every Lua program
//! mirrors one of them operation for operation and is property-tested against it on a real
//! Redis. All arithmetic goes through [`crate::exact`], so leaving `0..=2^53-1` is an error,
//! never a silent wrap.
//!
//! Rules every algorithm shares:
//! - `now_ms` is the provider's clock (Redis `TIME`); above [`MAX_TIME_MS`] it is refused.
//! - State remembers the time of its last write (`last_ms`, the last observed time). A clock
//!   behind it by at most `max_clock_regression_ms` is clamped to it; further behind, the
//!   answer is `ClockUnsafe` and state is untouched.
//! - Only an allow writes state; a denial consumes nothing and changes nothing.
//! - A write carries a finite time to live: until the state would no longer differ from no
//!   state at all, plus `cleanup_grace_ms`.

pub mod concurrency;
pub mod denial;
pub mod fixed_window;
pub mod gcra;
pub mod multi;
pub mod reserve;
mod settlement;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use crate::decision::{RateLimitDecision, Source};
use crate::exact::{self, OutOfRange};
use crate::ids::Cost;
use crate::policy::{Algorithm, MAX_TIME_MS, RateLimitPolicy};

pub use crate::policy::Rules;
pub use concurrency::ConcurrencyState;
pub use denial::DenialBound;
pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindowState;
pub use token_bucket::TokenBucketState;

/// The verdict of one evaluation, as the Lua programs' status field names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The request fits and is charged: `new_state` holds the state to store.
    Allowed,
    /// The request does not fit; nothing changed.
    Denied,
    /// The clock went back further than the policy allows; nothing changed.
    ClockUnsafe,
}

/// The full result of one model step: the seven reply fields plus the state to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation<S> {
    /// Allowed, denied, or refused for a clock that went back too far.
    pub verdict: Verdict,
    /// The provider's clock reading the evaluation was given (Unix ms).
    pub server_now_ms: u64,
    /// The time computed with (Unix ms): `server_now_ms`, or the last write's time when the clock
    /// went back; for `ClockUnsafe` the last write's time.
    pub effective_now_ms: u64,
    /// The most cost admissible at once (limit, capacity or burst).
    pub limit: u64,
    /// Cost still admissible at the effective time, after this request when allowed; 0 for
    /// `ClockUnsafe`.
    pub remaining: u64,
    /// Milliseconds until this request alone could be admitted; 0 when allowed; for `ClockUnsafe`,
    /// until the clock is back at the last write.
    pub retry_after_ms: u64,
    /// Unix ms when the full quota is available again; for `ClockUnsafe`, the last write's time.
    pub reset_at_ms: u64,
    /// `Some` exactly when the verdict is `Allowed`: the state to store.
    pub new_state: Option<S>,
    /// Time to live of `new_state` in ms (0 when nothing is written, and from [`decide`]).
    pub ttl_ms: u64,
    /// The stored key already expires `ttl_ms` from now, so the write may keep its expiry
    /// (`SET ... KEEPTTL`) rather than set it: every rate algorithm gives a state a deadline
    /// that the state itself determines (`reset_at_ms` plus the cleanup grace, a bucket's, a
    /// GCRA's and a sliding log's rounded up to a quantum), and the stored state's is this
    /// one's. A store that always sets `ttl_ms` is as exact. Always `false` from [`decide`].
    pub keeps_expiry: bool,
}

impl<S> Evaluation<S> {
    /// Replaces the state type (for the [`AlgorithmState`] dispatcher).
    pub fn map_state<T>(self, f: impl FnOnce(S) -> T) -> Evaluation<T> {
        Evaluation {
            verdict: self.verdict,
            server_now_ms: self.server_now_ms,
            effective_now_ms: self.effective_now_ms,
            limit: self.limit,
            remaining: self.remaining,
            retry_after_ms: self.retry_after_ms,
            reset_at_ms: self.reset_at_ms,
            new_state: self.new_state.map(f),
            ttl_ms: self.ttl_ms,
            keeps_expiry: self.keeps_expiry,
        }
    }

    /// The decision this evaluation stands for; `None` for `ClockUnsafe`.
    #[inline]
    pub fn decision(&self, policy: &RateLimitPolicy, source: Source) -> Option<RateLimitDecision> {
        let allowed = match self.verdict {
            Verdict::Allowed => true,
            Verdict::Denied => false,
            Verdict::ClockUnsafe => return None,
        };
        Some(RateLimitDecision {
            allowed,
            limit: self.limit,
            remaining: self.remaining,
            retry_after_ms: self.retry_after_ms,
            reset_at_ms: self.reset_at_ms,
            policy_id: policy.id().clone(),
            revision: policy.revision(),
            source,
            certainty: policy.kind().certainty(),
            fleet: None,
        })
    }

    /// A denial at the effective time `now` of a call made at `server_now_ms`, with
    /// `remaining` still available and nothing written; the algorithm fills in retry and
    /// reset, or turns it into an allow with [`Self::allow`].
    fn denied(server_now_ms: u64, now: u64, limit: u64, remaining: u64) -> Self {
        Evaluation {
            verdict: Verdict::Denied,
            server_now_ms,
            effective_now_ms: now,
            limit,
            remaining,
            retry_after_ms: 0,
            reset_at_ms: 0,
            new_state: None,
            ttl_ms: 0,
            keeps_expiry: false,
        }
    }

    /// Turns the evaluation into an allow that stores `state`, leaves `remaining` and resets
    /// `to_reset` ms after the effective time. Its expiry is the algorithm's to set, when
    /// asked for ([`Self::expire`]).
    #[inline]
    fn allow(&mut self, state: S, remaining: u64, to_reset: u64) -> Result<(), ModelError> {
        self.verdict = Verdict::Allowed;
        self.remaining = remaining;
        self.retry_after_ms = 0;
        self.reset_at_ms = exact::add(self.effective_now_ms, to_reset)?;
        self.new_state = Some(state);
        Ok(())
    }

    /// Sets the expiry of a write whose state stops mattering at `reset_at` (the effective
    /// time it is full again, its window's end, or its newest entry's exit): the deadline `reset_at + grace` rounded up
    /// to a multiple of `quantum` ms, on the provider's clock, so `ttl_ms` counts from
    /// `server_now_ms` (never shorter than from the effective time) and is at least 1. The
    /// write keeps the stored key's expiry when the stored state, which stops mattering at
    /// `stored_reset_at`, has the same deadline: every write by this rule set it so. A
    /// quantum lets a deadline that moves with every allow (a bucket's, a sliding log's) stay
    /// put for a while.
    ///
    /// `stored_reset_at` is never after `reset_at` (an allow only moves it later; the windows
    /// pass their own), so the stored deadline is this one exactly when the stored due is past
    /// the start of this deadline's quantum: one compare, not a second rounding.
    #[inline]
    fn expire(
        &mut self,
        reset_at: u64,
        stored_reset_at: Option<u64>,
        quantum: u64,
        rules: &Rules,
    ) -> Result<(), ModelError> {
        let due = exact::add(reset_at, rules.cleanup_grace_ms)?;
        // Below 2^53 + 2^40 (a time below 2^48 plus two durations below 2^40): no overflow.
        let at = due.next_multiple_of(quantum);
        self.ttl_ms = exact::sub(at, self.server_now_ms)?.max(1);
        self.keeps_expiry = stored_reset_at
            .is_some_and(|stored| stored.saturating_add(rules.cleanup_grace_ms) > at - quantum);
        Ok(())
    }

    fn clock_unsafe(now: u64, last: u64, limit: u64) -> Self {
        Evaluation {
            verdict: Verdict::ClockUnsafe,
            server_now_ms: now,
            effective_now_ms: last,
            limit,
            remaining: 0,
            // The server clock has to catch up with the last observed time.
            retry_after_ms: last - now,
            reset_at_ms: last,
            new_state: None,
            ttl_ms: 0,
            keeps_expiry: false,
        }
    }
}

/// Why a model refused to evaluate. Providers report these as `Incompatible`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// An intermediate value left `0..=2^53-1`: a model bug, or a policy validation should have
    /// refused.
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    /// Stored state the model could not have written under this policy; carries what does not fit.
    #[error("stored state does not fit the policy: {0}")]
    StateIncompatible(&'static str),
    /// The clock reading (Unix ms) is above [`MAX_TIME_MS`]; carries the reading.
    #[error("clock {0} ms is beyond the supported range")]
    ClockOutOfRange(u64),
    /// The cost is above the policy's `max_cost`.
    #[error("cost {cost} is above max_cost {max_cost}")]
    CostAboveMax {
        /// The request's cost.
        cost: u64,
        /// The policy's `max_cost`.
        max_cost: u64,
    },
    /// A concurrency policy is acquired and released, never evaluated ([`concurrency`]).
    #[error("a concurrency policy is not evaluated per request; acquire a lease instead")]
    NotRatePolicy,
    /// The algorithm has no reservations ([`reserve`]); carries its name.
    #[error("a {0} policy does not take reservations")]
    ReservationUnsupported(&'static str),
}

/// The quantum a bucket's, GCRA's or sliding log's deadline is rounded up to
/// ([`Evaluation::expire`]): an eighth of its horizon (`horizon_ms`: the time from empty to
/// full, or the log's window), at most the cleanup grace less the allowed clock regression,
/// at least 1 ms. A key lives up to that much longer than it must; a steady stream of allows
/// sets its expiry about once a quantum. The cap keeps a kept
/// deadline safe when a build before this rule set it (from the effective time, unrounded):
/// a state kept under it is full within one quantum of the stored state, so no later than
/// that deadline.
#[inline]
fn quantum(horizon_ms: u64, rules: &Rules) -> u64 {
    let room = rules
        .cleanup_grace_ms
        .saturating_sub(rules.max_clock_regression_ms);
    (horizon_ms / 8).min(room).max(1)
}

/// The clock rule: the time an algorithm computes with, or the stored time it fell behind.
enum EffectiveNow {
    Safe(u64),
    Unsafe { last: u64 },
}

#[inline]
fn effective_now(
    last_ms: Option<u64>,
    now_ms: u64,
    rules: &Rules,
) -> Result<EffectiveNow, ModelError> {
    if now_ms > MAX_TIME_MS {
        return Err(ModelError::ClockOutOfRange(now_ms));
    }
    Ok(match last_ms {
        Some(last) if now_ms < last => {
            if exact::sub(last, now_ms)? > rules.max_clock_regression_ms {
                EffectiveNow::Unsafe { last }
            } else {
                EffectiveNow::Safe(last)
            }
        }
        _ => EffectiveNow::Safe(now_ms),
    })
}

/// Stored state of one algorithm, as the step every algorithm shares reads it.
pub(crate) trait Stored {
    /// The validated parameters the state must fit.
    type Params;
    /// Time of the last write (the last observed time).
    fn last_ms(&self) -> u64;
    /// Refuses state the model could not have written under `p` (beyond the shared
    /// `last_ms` bound, which [`step`] checks).
    fn check(&self, p: &Self::Params) -> Result<(), ModelError>;
}

/// The step every algorithm shares around its own arithmetic: refuse stored state that does
/// not fit `p`, apply the clock rule, and answer `ClockUnsafe` (reporting `limit`) when the
/// clock fell too far behind. Otherwise `decide` computes with the effective time.
#[inline]
pub(crate) fn step<S: Stored, O: From<Evaluation<S>>>(
    p: &S::Params,
    rules: &Rules,
    state: Option<&S>,
    now_ms: u64,
    limit: u64,
    decide: impl FnOnce(u64) -> Result<O, ModelError>,
) -> Result<O, ModelError> {
    if let Some(s) = state {
        check_last(s.last_ms())?;
        s.check(p)?;
    }
    match effective_now(state.map(S::last_ms), now_ms, rules)? {
        EffectiveNow::Safe(now) => decide(now),
        EffectiveNow::Unsafe { last } => Ok(Evaluation::clock_unsafe(now_ms, last, limit).into()),
    }
}

/// `last_ms` of stored state must be a time the models could have written.
#[inline]
fn check_last(last_ms: u64) -> Result<(), ModelError> {
    if last_ms > MAX_TIME_MS {
        Err(ModelError::StateIncompatible(
            "last_ms beyond the supported time range",
        ))
    } else {
        Ok(())
    }
}

/// State of any algorithm, for providers that store all policies alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlgorithmState {
    /// State of a fixed-window policy.
    FixedWindow(FixedWindowState),
    /// State of a sliding-window-counter policy.
    SlidingWindow(SlidingWindowState),
    /// State of a token-bucket policy.
    TokenBucket(TokenBucketState),
    /// State of a GCRA policy.
    Gcra(GcraState),
    /// State of a sliding-log policy.
    SlidingLog(SlidingLogState),
    /// State of a concurrency policy (its leases).
    Concurrency(ConcurrencyState),
}

/// Evaluates `cost` against `policy` with its stored `state` at `now_ms`.
///
/// # Errors
/// [`ModelError::StateIncompatible`] when `state` belongs to another algorithm or does not fit
/// the policy, [`ModelError::CostAboveMax`], [`ModelError::ClockOutOfRange`],
/// [`ModelError::NotRatePolicy`] for a concurrency policy; `OutOfRange` only
/// on a model bug (the property tests prove it unreachable for valid policies).
// `#[inline]` here and on the algorithms' `evaluate`, `step` and `decision`: providers call
// this once per decision from another crate, and inlining it there measured 15% of a local
// decision (docs/performance.md).
#[inline]
pub fn evaluate(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: Cost,
) -> Result<Evaluation<AlgorithmState>, ModelError> {
    evaluate_as::<true>(policy, state, now_ms, cost)
}

/// [`evaluate`] without the write's expiry: `ttl_ms` is 0 and `keeps_expiry` false, every
/// other field as [`evaluate`] answers (the property tests check it). For a store that gives
/// its entries lifetimes of its own (the local provider): the expiry is a Redis key's
/// deadline, and computing it costs more than the rest of a bucket's model step.
///
/// # Errors
/// As [`evaluate`].
#[inline]
pub fn decide(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: Cost,
) -> Result<Evaluation<AlgorithmState>, ModelError> {
    evaluate_as::<false>(policy, state, now_ms, cost)
}

/// [`evaluate`] (`EXPIRY`) or [`decide`]: the algorithms are generic alike, so the expiry's
/// arithmetic is compiled out of [`decide`] rather than skipped at run time.
#[inline]
fn evaluate_as<const EXPIRY: bool>(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: Cost,
) -> Result<Evaluation<AlgorithmState>, ModelError> {
    let cost = cost.get();
    if cost > policy.max_cost().get() {
        return Err(ModelError::CostAboveMax {
            cost,
            max_cost: policy.max_cost().get(),
        });
    }
    let rules = policy.rules();
    let mismatch = || ModelError::StateIncompatible("state of another algorithm");
    Ok(match (policy.algorithm(), state) {
        (Algorithm::FixedWindow(p), None) => {
            fixed_window::evaluate_as::<EXPIRY>(p, &rules, None, now_ms, cost)?
                .map_state(AlgorithmState::FixedWindow)
        }
        (Algorithm::FixedWindow(p), Some(AlgorithmState::FixedWindow(s))) => {
            fixed_window::evaluate_as::<EXPIRY>(p, &rules, Some(s), now_ms, cost)?
                .map_state(AlgorithmState::FixedWindow)
        }
        (Algorithm::SlidingWindow(p), None) => {
            sliding_window::evaluate_as::<EXPIRY>(p, &rules, None, now_ms, cost)?
                .map_state(AlgorithmState::SlidingWindow)
        }
        (Algorithm::SlidingWindow(p), Some(AlgorithmState::SlidingWindow(s))) => {
            sliding_window::evaluate_as::<EXPIRY>(p, &rules, Some(s), now_ms, cost)?
                .map_state(AlgorithmState::SlidingWindow)
        }
        (Algorithm::TokenBucket(p), None) => {
            token_bucket::evaluate_as::<EXPIRY>(p, &rules, None, now_ms, cost)?
                .map_state(AlgorithmState::TokenBucket)
        }
        (Algorithm::TokenBucket(p), Some(AlgorithmState::TokenBucket(s))) => {
            token_bucket::evaluate_as::<EXPIRY>(p, &rules, Some(s), now_ms, cost)?
                .map_state(AlgorithmState::TokenBucket)
        }
        (Algorithm::Gcra(p), None) => gcra::evaluate_as::<EXPIRY>(p, &rules, None, now_ms, cost)?
            .map_state(AlgorithmState::Gcra),
        (Algorithm::Gcra(p), Some(AlgorithmState::Gcra(s))) => {
            gcra::evaluate_as::<EXPIRY>(p, &rules, Some(s), now_ms, cost)?
                .map_state(AlgorithmState::Gcra)
        }
        (Algorithm::SlidingLog(p), None) => {
            sliding_log::evaluate_as::<EXPIRY>(p, &rules, None, now_ms, cost)?
                .map_state(AlgorithmState::SlidingLog)
        }
        (Algorithm::SlidingLog(p), Some(AlgorithmState::SlidingLog(s))) => {
            sliding_log::evaluate_as::<EXPIRY>(p, &rules, Some(s), now_ms, cost)?
                .map_state(AlgorithmState::SlidingLog)
        }
        (Algorithm::Concurrency(_), _) => return Err(ModelError::NotRatePolicy),
        (_, Some(_)) => return Err(mismatch()),
    })
}
