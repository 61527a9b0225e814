//! GCRA (generic cell rate algorithm): sustained `limit` per `period`, up to `burst` at once.
//!
//! Time is counted in units of `1/units_per_ms` ms; one cost unit's emission interval is
//! `interval_units` (see [`GcraParams`]). Instead of the theoretical arrival time (TAT) itself,
//! state keeps the debt `TAT - last_ms` in units, which stays below `burst * interval_units`:
//! no timestamp is ever scaled, so nothing approaches 2^53.
//!
//! - `debt = max(0, stored_debt - elapsed * units_per_ms)` (product formed only when smaller);
//! - allow iff `debt + cost * interval_units <= burst * interval_units`;
//! - `retry_after = ceil((debt + cost * interval_units - tolerance) / units_per_ms)`;
//! - `reset_at = now + ceil(debt_after / units_per_ms)`, when the TAT is reached.
//!
//! From empty state it admits `burst` at once, then `limit` per `period`. This is the same
//! envelope as a token bucket of `burst` tokens refilled at `limit/period`, reached from the
//! other side (debt instead of credit), as in redis-cell and go-redis/redis_rate.

use super::{Evaluation, ModelError, Rules, Stored, step};
use crate::exact::{add, div, div_ceil, mul, sub};
use crate::policy::GcraParams;

/// Stored state of a GCRA policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraState {
    /// Effective time (Unix ms) of the last allow, from which `debt` is repaid.
    pub last_ms: u64,
    /// `TAT - last_ms`, in time units.
    pub debt: u64,
}

impl Stored for GcraState {
    type Params = GcraParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    fn check(&self, p: &GcraParams) -> Result<(), ModelError> {
        if self.debt > p.tolerance_units() {
            return Err(ModelError::StateIncompatible("debt above burst tolerance"));
        }
        Ok(())
    }
}

/// Debt left at `now` (>= `s.last_ms`).
pub fn repay(p: &GcraParams, s: &GcraState, now: u64) -> Result<u64, ModelError> {
    let elapsed = sub(now, s.last_ms)?;
    // Paid off once elapsed * rate >= debt, i.e. elapsed >= ceil(debt / rate).
    if elapsed >= div_ceil(s.debt, p.units_per_ms())? {
        Ok(0)
    } else {
        Ok(sub(s.debt, mul(elapsed, p.units_per_ms())?)?)
    }
}

/// One GCRA step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn evaluate(
    p: &GcraParams,
    rules: &Rules,
    state: Option<&GcraState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<GcraState>, ModelError> {
    step(p, rules, state, now_ms, p.burst(), |now| {
        let debt = match state {
            Some(s) => repay(p, s, now)?,
            None => 0,
        };
        let tolerance = p.tolerance_units();
        let need = mul(cost, p.interval_units())?;
        let credit = sub(tolerance, debt)?;
        let remaining = div(credit, p.interval_units())?;
        let mut out = Evaluation::denied(now_ms, now, p.burst(), remaining);
        if need <= credit {
            let debt = add(debt, need)?;
            let remaining = div(sub(tolerance, debt)?, p.interval_units())?;
            let to_reset = div_ceil(debt, p.units_per_ms())?;
            out.allow(GcraState { last_ms: now, debt }, remaining, to_reset, rules)?;
        } else {
            out.retry_after_ms = div_ceil(sub(need, credit)?, p.units_per_ms())?;
            out.reset_at_ms = add(now, div_ceil(debt, p.units_per_ms())?)?;
        }
        Ok(out)
    })
}
