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
//! State: `last_ms` (time of the last allow) and `tokens` in units at that time.

use super::{Evaluation, ModelError, Rules, Stored, step};
use crate::exact::{add, div, div_ceil, mul, rem, sub};
use crate::policy::TokenBucketParams;

/// Stored state of a token-bucket policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Effective time (Unix ms) of the last allow, from which the bucket refills.
    pub last_ms: u64,
    /// Tokens at `last_ms`, in units of `1/scale` token.
    pub tokens: u64,
}

impl Stored for TokenBucketState {
    type Params = TokenBucketParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    fn check(&self, p: &TokenBucketParams) -> Result<(), ModelError> {
        if self.tokens > p.capacity_units() {
            return Err(ModelError::StateIncompatible("tokens above capacity"));
        }
        Ok(())
    }
}

/// Units in the bucket at `now` (>= `s.last_ms`), saturating at capacity.
pub fn refill(p: &TokenBucketParams, s: &TokenBucketState, now: u64) -> Result<u64, ModelError> {
    let missing = sub(p.capacity_units(), s.tokens)?;
    let elapsed = sub(now, s.last_ms)?;
    // Full once elapsed * rate >= missing, i.e. elapsed > q, or elapsed == q with no remainder.
    let q = div(missing, p.units_per_ms())?;
    let full = elapsed > q || (elapsed == q && rem(missing, p.units_per_ms())? == 0);
    Ok(if full {
        p.capacity_units()
    } else {
        add(s.tokens, mul(elapsed, p.units_per_ms())?)?
    })
}

/// One token-bucket step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn evaluate(
    p: &TokenBucketParams,
    rules: &Rules,
    state: Option<&TokenBucketState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<TokenBucketState>, ModelError> {
    step(p, rules, state, now_ms, p.capacity(), |now| {
        let tokens = match state {
            Some(s) => refill(p, s, now)?,
            None => p.capacity_units(),
        };
        let need = mul(cost, p.scale())?;
        let mut out = Evaluation::denied(now_ms, now, p.capacity(), div(tokens, p.scale())?);
        // Time until the bucket is full again, from `left` units.
        let to_full = |left| div_ceil(sub(p.capacity_units(), left)?, p.units_per_ms());
        if need <= tokens {
            let left = sub(tokens, need)?;
            let state = TokenBucketState {
                last_ms: now,
                tokens: left,
            };
            out.allow(state, div(left, p.scale())?, to_full(left)?, rules)?;
        } else {
            out.retry_after_ms = div_ceil(sub(need, tokens)?, p.units_per_ms())?;
            out.reset_at_ms = add(now, to_full(tokens)?)?;
        }
        Ok(out)
    })
}
