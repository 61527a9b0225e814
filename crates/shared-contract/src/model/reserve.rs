//! Reservations: a cost known only after the work (LLM tokens) is reserved as an estimate,
//! then settled with the actual cost.
//!
//! - **Reserve** is an evaluation of cost `estimate` ([`reserve`]): admitted or denied exactly
//!   as [`super::evaluate`] answers, and when admitted it leaves a [`Hold`] (the estimate and
//!   the effective time it was charged at).
//! - **Settle** ([`settle`]) charges the actual cost against the hold, and can never be
//!   denied (the work is done):
//!   - `actual > estimate`: the difference is charged now, past the limit if need be. The
//!     policy is then in *overdraft*, and denies every request until the overdraft is paid
//!     down: refilled (token bucket), repaid (GCRA) or, for a window, until the window it was
//!     charged in ends.
//!   - `actual < estimate`: the unused part is refunded, but only the part the policy still
//!     holds, so that a refund never admits more than charging `actual` in the first place
//!     would have (the property tests compare with exactly that):
//!     - fixed window: while the reservation's window lasts; after it, nothing (that window's
//!       count is gone anyway);
//!     - sliding window counter: the same. In the next window the reservation's window is
//!       the previous one, but its count may have been capped at the limit (an overdraft
//!       counts only in its own window), so a refund there could return more than it holds;
//!     - token bucket and GCRA: the unused part less what the policy refilled (repaid) since
//!       the reservation, `max(0, unused - rate * elapsed)`: that much capacity came back by
//!       itself meanwhile, so returning it again would exceed the envelope.
//!   - Cancel is a settlement with `actual = 0`; a reservation never settled stays charged at
//!     its estimate (nothing to do).
//! - Sliding log and concurrency policies take no reservations
//!   ([`ModelError::ReservationUnsupported`]).
//!
//! Settling writes state (verdict `Allowed`) unless the clock is unsafe, which changes nothing
//! ([`Verdict::ClockUnsafe`]): the reservation then stays as it was, to be settled again.
//! An overdraft saturates where paying it down would take
//! [`MAX_DURATION_MS`](crate::policy::MAX_DURATION_MS) (about 34
//! years) for a token bucket or GCRA, and at 2^53-1 for a window.

use crate::ids::Cost;
use crate::policy::{Algorithm, RateLimitPolicy};

pub use super::settlement::{Hold, Settlement};
use super::{
    AlgorithmState, Evaluation, ModelError, Verdict, fixed_window, gcra, sliding_log,
    sliding_window, token_bucket,
};

/// Refuses a policy whose algorithm takes no reservations.
pub(crate) fn supported(policy: &RateLimitPolicy) -> Result<(), ModelError> {
    let kind = policy.kind();
    if kind.takes_reservations() {
        Ok(())
    } else {
        Err(ModelError::ReservationUnsupported(kind.as_str()))
    }
}

/// Reserves `estimate` against `policy`: the evaluation of that cost, and the hold to settle
/// when it admitted.
///
/// # Errors
/// As [`super::evaluate`], and [`ModelError::ReservationUnsupported`] for a sliding log or a
/// concurrency policy.
pub fn reserve(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    estimate: Cost,
) -> Result<(Evaluation<AlgorithmState>, Option<Hold>), ModelError> {
    supported(policy)?;
    let evaluation = super::evaluate(policy, state, now_ms, estimate)?;
    let hold = (evaluation.verdict == Verdict::Allowed).then_some(Hold {
        at_ms: evaluation.effective_now_ms,
        estimate: estimate.get(),
    });
    Ok((evaluation, hold))
}

/// Settles `hold` with the `actual` cost (0 cancels); see the module docs.
///
/// # Errors
/// [`ModelError::CostAboveMax`] when `actual` is above the policy's `max_cost` (no single
/// request may cost more), [`ModelError::ReservationUnsupported`], and the state and clock
/// errors of [`super::evaluate`].
pub fn settle(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
) -> Result<Settlement<AlgorithmState>, ModelError> {
    settle_up_to(policy, state, now_ms, hold, actual, policy.max_cost().get())
}

/// [`settle`] with `actual` bounded by `bound` instead of the policy's `max_cost`.
fn settle_up_to(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
    bound: u64,
) -> Result<Settlement<AlgorithmState>, ModelError> {
    supported(policy)?;
    if actual > bound {
        return Err(ModelError::CostAboveMax {
            cost: actual,
            max_cost: bound,
        });
    }
    let rules = policy.rules();
    let mismatch = || ModelError::StateIncompatible("state of another algorithm");
    Ok(match (policy.algorithm(), state) {
        (Algorithm::FixedWindow(p), None) => {
            fixed_window::settle(p, &rules, None, now_ms, hold, actual)?
                .map_state(AlgorithmState::FixedWindow)
        }
        (Algorithm::FixedWindow(p), Some(AlgorithmState::FixedWindow(s))) => {
            fixed_window::settle(p, &rules, Some(s), now_ms, hold, actual)?
                .map_state(AlgorithmState::FixedWindow)
        }
        (Algorithm::SlidingWindow(p), None) => {
            sliding_window::settle(p, &rules, None, now_ms, hold, actual)?
                .map_state(AlgorithmState::SlidingWindow)
        }
        (Algorithm::SlidingWindow(p), Some(AlgorithmState::SlidingWindow(s))) => {
            sliding_window::settle(p, &rules, Some(s), now_ms, hold, actual)?
                .map_state(AlgorithmState::SlidingWindow)
        }
        (Algorithm::TokenBucket(p), None) => {
            token_bucket::settle(p, &rules, None, now_ms, hold, actual)?
                .map_state(AlgorithmState::TokenBucket)
        }
        (Algorithm::TokenBucket(p), Some(AlgorithmState::TokenBucket(s))) => {
            token_bucket::settle(p, &rules, Some(s), now_ms, hold, actual)?
                .map_state(AlgorithmState::TokenBucket)
        }
        (Algorithm::Gcra(p), None) => {
            gcra::settle(p, &rules, None, now_ms, hold, actual)?.map_state(AlgorithmState::Gcra)
        }
        (Algorithm::Gcra(p), Some(AlgorithmState::Gcra(s))) => {
            gcra::settle(p, &rules, Some(s), now_ms, hold, actual)?.map_state(AlgorithmState::Gcra)
        }
        (_, Some(_)) => return Err(mismatch()),
        // `supported` refused the other algorithms.
        (_, None) => return Err(ModelError::ReservationUnsupported(policy.kind().as_str())),
    })
}

/// Charges `cost` now, past the limit if need be: a settlement of a hold of nothing. This is
/// what charging the actual cost in the first place would have done, the reference the
/// property tests hold refunds to.
///
/// # Errors
/// As [`settle`].
pub fn charge(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: u64,
) -> Result<Settlement<AlgorithmState>, ModelError> {
    charge_up_to(policy, state, now_ms, cost, policy.max_cost().get())
}

/// [`charge`] of up to the policy's whole limit (capacity, burst) at once, not bounded by its
/// `max_cost`: what is not a request's cost but a quota already spent elsewhere (the fleet
/// share's start from the global provider's last answer). A sliding log, which holds no
/// overdraft (its entries never sum above the limit), takes an entry of what fits of `cost`
/// at `now_ms`; a `cost` of 0 changes nothing.
///
/// # Errors
/// [`ModelError::CostAboveMax`] when `cost` is above the limit, and as [`settle`] (a
/// concurrency policy takes no charges).
pub fn charge_spent(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: u64,
) -> Result<Settlement<AlgorithmState>, ModelError> {
    let Algorithm::SlidingLog(p) = policy.algorithm() else {
        return charge_up_to(policy, state, now_ms, cost, policy.algorithm().limit());
    };
    if cost > p.limit() {
        return Err(ModelError::CostAboveMax {
            cost,
            max_cost: p.limit(),
        });
    }
    let state = match state {
        None => None,
        Some(AlgorithmState::SlidingLog(s)) => Some(s),
        Some(_) => return Err(ModelError::StateIncompatible("state of another algorithm")),
    };
    let rules = policy.rules();
    // The entry is what fits: an evaluation of `cost`, or of what is available when it is less.
    let mut e = sliding_log::evaluate(p, &rules, state, now_ms, cost.max(1))?;
    if e.verdict == Verdict::Denied && e.remaining > 0 {
        e = sliding_log::evaluate(p, &rules, state, now_ms, e.remaining)?;
    }
    if cost == 0 || e.verdict != Verdict::Allowed {
        // Nothing fits (or nothing was asked): the state stays as it is.
        e.new_state = None;
    }
    Ok(Settlement::from(e.map_state(AlgorithmState::SlidingLog)))
}

/// A settlement of a hold of nothing, `cost` bounded by `bound`.
fn charge_up_to(
    policy: &RateLimitPolicy,
    state: Option<&AlgorithmState>,
    now_ms: u64,
    cost: u64,
    bound: u64,
) -> Result<Settlement<AlgorithmState>, ModelError> {
    let hold = Hold {
        at_ms: now_ms,
        estimate: 0,
    };
    settle_up_to(policy, state, now_ms, &hold, cost, bound)
}
