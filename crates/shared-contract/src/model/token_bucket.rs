//! Token bucket: `capacity` tokens, starting full, refilled continuously at
//! `refill_amount / refill_interval`, saturating at capacity.
//!
//! Tokens are counted in units of `1/scale` token (see [`TokenBucketParams`]); one ms adds
//! exactly `units_per_ms` units. The sub-token remainder of every refill stays in the low part
//! of the count, so refilling at many intermediate times equals refilling once at the end:
//! refill does not depend on how often the bucket is evaluated.
//!
//! - `tokens = min(capacity_units, stored + elapsed * units_per_ms)`, where the product is
//!   formed only when it cannot exceed the missing units (no overflow near 2^53);
//! - allow iff `cost * scale <= tokens`; a denial subtracts nothing;
//! - `retry_after = ceil((cost * scale - tokens) / units_per_ms)`;
//! - `reset_at = now + ceil((capacity_units - tokens_after) / units_per_ms)`.
//!
//! Expiry: a state stops mattering when the bucket is full again (`reset_at`); its key
//! expires at `reset_at + grace` rounded up to a quantum (an eighth of the time the bucket
//! takes to fill from empty, at most the grace less the allowed clock regression), and a
//! write whose state rounds to the stored state's deadline keeps it
//! ([`Evaluation::keeps_expiry`]): a stream of allows sets the expiry about once a quantum.
//!
//! State: `last_ms` (time of the last write), `tokens` in units at that time and
//! `overdraft`: units a settlement ([`super::reserve`]) charged beyond an empty bucket. The
//! refill pays the overdraft first; nothing is admitted until it is paid.

use super::settlement::{Hold, Settlement, adjust, decayed, most_owed};
use super::{Evaluation, ModelError, Rules, Stored, quantum, step};
use crate::exact::{add, div, div_ceil, mul, product_reaches, sub};
use crate::policy::TokenBucketParams;

/// Stored state of a token-bucket policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Effective time (Unix ms) of the last write, from which the bucket refills.
    pub last_ms: u64,
    /// Tokens at `last_ms`, in units of `1/scale` token.
    pub tokens: u64,
    /// Units owed beyond an empty bucket at `last_ms` (0 unless `tokens` is 0).
    pub overdraft: u64,
}

impl TokenBucketState {
    /// The state at `last_ms` missing `missing` units of a full bucket, overdraft included.
    pub fn missing(p: &TokenBucketParams, last_ms: u64, missing: u64) -> Self {
        let short = missing.min(p.capacity_units());
        TokenBucketState {
            last_ms,
            tokens: p.capacity_units() - short,
            overdraft: missing - short,
        }
    }
}

impl Stored for TokenBucketState {
    type Params = TokenBucketParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    #[inline]
    fn check(&self, p: &TokenBucketParams) -> Result<(), ModelError> {
        if self.tokens > p.capacity_units() {
            return Err(ModelError::StateIncompatible("tokens above capacity"));
        }
        if self.overdraft > 0 && self.tokens != 0 {
            return Err(ModelError::StateIncompatible("overdraft with tokens left"));
        }
        if self.overdraft > most_owed(p.units_per_ms()) - p.capacity_units() {
            return Err(ModelError::StateIncompatible("overdraft out of range"));
        }
        Ok(())
    }
}

/// Units missing from a full bucket at `now` (>= `s.last_ms`), overdraft included.
#[inline]
pub fn missing(p: &TokenBucketParams, s: &TokenBucketState, now: u64) -> Result<u64, ModelError> {
    let missing = add(sub(p.capacity_units(), s.tokens)?, s.overdraft)?;
    let elapsed = sub(now, s.last_ms)?;
    // Full once elapsed * rate >= missing.
    Ok(if product_reaches(elapsed, p.units_per_ms(), missing) {
        0
    } else {
        sub(missing, mul(elapsed, p.units_per_ms())?)?
    })
}

/// When the bucket of `s` is full again (Unix ms, effective time), overdraft paid.
#[inline]
fn full_at(p: &TokenBucketParams, s: &TokenBucketState) -> Result<u64, ModelError> {
    let missing = add(sub(p.capacity_units(), s.tokens)?, s.overdraft)?;
    Ok(add(s.last_ms, div_ceil(missing, p.units_per_ms())?)?)
}

/// The quantum of `p`'s deadlines: an eighth of the time from empty to full, capped.
#[inline]
fn bucket_quantum(p: &TokenBucketParams, rules: &Rules) -> Result<u64, ModelError> {
    Ok(quantum(
        div_ceil(p.capacity_units(), p.units_per_ms())?,
        rules,
    ))
}

/// Units in the bucket at `now` (>= `s.last_ms`), saturating at capacity; 0 in overdraft.
pub fn refill(p: &TokenBucketParams, s: &TokenBucketState, now: u64) -> Result<u64, ModelError> {
    Ok(p.capacity_units().saturating_sub(missing(p, s, now)?))
}

/// One token-bucket step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
#[inline]
pub fn evaluate(
    p: &TokenBucketParams,
    rules: &Rules,
    state: Option<&TokenBucketState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<TokenBucketState>, ModelError> {
    evaluate_as::<true>(p, rules, state, now_ms, cost)
}

/// [`evaluate`], with the write's expiry when `EXPIRY` ([`super::decide`]).
#[inline]
pub(super) fn evaluate_as<const EXPIRY: bool>(
    p: &TokenBucketParams,
    rules: &Rules,
    state: Option<&TokenBucketState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<TokenBucketState>, ModelError> {
    step(p, rules, state, now_ms, p.capacity(), |now| {
        let missing = match state {
            Some(s) => missing(p, s, now)?,
            None => 0,
        };
        let tokens = p.capacity_units().saturating_sub(missing);
        let need = mul(cost, p.scale())?;
        // `remaining` is set on each branch: a division is worth computing once.
        let mut out = Evaluation::denied(now_ms, now, p.capacity(), 0);
        if need <= tokens {
            let stored = match state {
                Some(s) if EXPIRY => Some(full_at(p, s)?),
                _ => None,
            };
            let left = sub(tokens, need)?;
            let to_full = div_ceil(sub(p.capacity_units(), left)?, p.units_per_ms())?;
            let state = TokenBucketState {
                last_ms: now,
                tokens: left,
                overdraft: 0,
            };
            out.allow(state, div(left, p.scale())?, to_full)?;
            if EXPIRY {
                out.expire(out.reset_at_ms, stored, bucket_quantum(p, rules)?, rules)?;
            }
        } else {
            // In overdraft, `missing - capacity + need` stays in range: `need <= capacity`.
            let short = if missing > p.capacity_units() {
                add(sub(missing, p.capacity_units())?, need)?
            } else {
                sub(need, tokens)?
            };
            out.remaining = div(tokens, p.scale())?;
            out.retry_after_ms = div_ceil(short, p.units_per_ms())?;
            out.reset_at_ms = add(now, div_ceil(missing, p.units_per_ms())?)?;
        }
        Ok(out)
    })
}

/// Settles `hold` with `actual`: see [`super::reserve`]. The unused part comes back less
/// what the bucket refilled since the reservation.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn settle(
    p: &TokenBucketParams,
    rules: &Rules,
    state: Option<&TokenBucketState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
) -> Result<Settlement<TokenBucketState>, ModelError> {
    step(p, rules, state, now_ms, p.capacity(), |now| {
        let missing = match state {
            Some(s) => missing(p, s, now)?,
            None => 0,
        };
        let elapsed = now.saturating_sub(hold.at_ms);
        let most = most_owed(p.units_per_ms());
        let (missing, change) = adjust((missing, most), hold, actual, p.scale(), |unused| {
            decayed(unused, p.units_per_ms(), elapsed)
        })?;
        let state = TokenBucketState::missing(p, now, missing);
        let remaining = div(state.tokens, p.scale())?;
        let mut out = Evaluation::denied(now_ms, now, p.capacity(), remaining);
        let to_full = div_ceil(missing, p.units_per_ms())?;
        out.allow(state, remaining, to_full)?;
        // Its deadline set, at least 1 ms away also when nothing is left counted.
        out.expire(out.reset_at_ms, None, bucket_quantum(p, rules)?, rules)?;
        Ok(change.with(out))
    })
}
