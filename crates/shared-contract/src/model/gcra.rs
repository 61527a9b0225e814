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
//!
//! Expiry: a state stops mattering when its debt is repaid (`reset_at`, the TAT); its key
//! expires at `reset_at + grace` rounded up to a quantum (an eighth of the time a full burst
//! takes to repay, at most the grace less the allowed clock regression), and a write whose
//! state rounds to the stored state's deadline keeps it ([`Evaluation::keeps_expiry`]), as
//! the token bucket's does.
//!
//! A settlement ([`super::reserve`]) may leave debt beyond the tolerance, kept as `overdraft`:
//! it is repaid like the rest of the debt, and nothing is admitted until it is.

use super::settlement::{Hold, Settlement, adjust, decayed, most_owed};
use super::{Evaluation, ModelError, Rules, Stored, quantum, step};
use crate::exact::{add, div, div_ceil, mul, product_reaches, sub};
use crate::policy::GcraParams;

/// Stored state of a GCRA policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraState {
    /// Effective time (Unix ms) of the last write, from which `debt` is repaid.
    pub last_ms: u64,
    /// `TAT - last_ms`, in time units, at most the burst tolerance.
    pub debt: u64,
    /// Debt beyond the tolerance, in time units (0 unless `debt` is the tolerance).
    pub overdraft: u64,
}

impl GcraState {
    /// The state at `last_ms` owing `total` time units in all.
    pub fn owing(p: &GcraParams, last_ms: u64, total: u64) -> Self {
        let debt = total.min(p.tolerance_units());
        GcraState {
            last_ms,
            debt,
            overdraft: total - debt,
        }
    }
}

impl Stored for GcraState {
    type Params = GcraParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    #[inline]
    fn check(&self, p: &GcraParams) -> Result<(), ModelError> {
        if self.debt > p.tolerance_units() {
            return Err(ModelError::StateIncompatible("debt above burst tolerance"));
        }
        if self.overdraft > 0 && self.debt != p.tolerance_units() {
            return Err(ModelError::StateIncompatible(
                "overdraft below the tolerance",
            ));
        }
        if self.overdraft > most_owed(p.units_per_ms()) - p.tolerance_units() {
            return Err(ModelError::StateIncompatible("overdraft out of range"));
        }
        Ok(())
    }
}

/// Debt left at `now` (>= `s.last_ms`), overdraft included.
#[inline]
pub fn repay(p: &GcraParams, s: &GcraState, now: u64) -> Result<u64, ModelError> {
    let elapsed = sub(now, s.last_ms)?;
    let total = add(s.debt, s.overdraft)?;
    // Paid off once elapsed * rate >= debt, i.e. elapsed >= ceil(debt / rate).
    if product_reaches(elapsed, p.units_per_ms(), total) {
        Ok(0)
    } else {
        Ok(sub(total, mul(elapsed, p.units_per_ms())?)?)
    }
}

/// When the debt of `s` is repaid (Unix ms, effective time: the TAT), overdraft included.
#[inline]
fn repaid_at(p: &GcraParams, s: &GcraState) -> Result<u64, ModelError> {
    let total = add(s.debt, s.overdraft)?;
    Ok(add(s.last_ms, div_ceil(total, p.units_per_ms())?)?)
}

/// The quantum of `p`'s deadlines: an eighth of the time a full burst takes to repay, capped.
#[inline]
fn gcra_quantum(p: &GcraParams, rules: &Rules) -> Result<u64, ModelError> {
    Ok(quantum(
        div_ceil(p.tolerance_units(), p.units_per_ms())?,
        rules,
    ))
}

/// Whole cost units still admissible with `total` owed.
fn remaining(p: &GcraParams, total: u64) -> Result<u64, ModelError> {
    let credit = p.tolerance_units().saturating_sub(total);
    Ok(div(credit, p.interval_units())?)
}

/// One GCRA step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
#[inline]
pub fn evaluate(
    p: &GcraParams,
    rules: &Rules,
    state: Option<&GcraState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<GcraState>, ModelError> {
    evaluate_as::<true>(p, rules, state, now_ms, cost)
}

/// [`evaluate`], with the write's expiry when `EXPIRY` ([`super::decide`]).
#[inline]
pub(super) fn evaluate_as<const EXPIRY: bool>(
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
        // `remaining` is set on each branch: a division is worth computing once.
        let mut out = Evaluation::denied(now_ms, now, p.burst(), 0);
        if debt <= tolerance && need <= sub(tolerance, debt)? {
            let stored = match state {
                Some(s) if EXPIRY => Some(repaid_at(p, s)?),
                _ => None,
            };
            let debt = add(debt, need)?;
            let to_reset = div_ceil(debt, p.units_per_ms())?;
            let state = GcraState {
                last_ms: now,
                debt,
                overdraft: 0,
            };
            out.allow(state, remaining(p, debt)?, to_reset)?;
            if EXPIRY {
                out.expire(out.reset_at_ms, stored, gcra_quantum(p, rules)?, rules)?;
            }
        } else {
            // In overdraft, `debt - tolerance + need` stays in range: `need <= tolerance`.
            let short = if debt > tolerance {
                add(sub(debt, tolerance)?, need)?
            } else {
                sub(need, sub(tolerance, debt)?)?
            };
            out.remaining = remaining(p, debt)?;
            out.retry_after_ms = div_ceil(short, p.units_per_ms())?;
            out.reset_at_ms = add(now, div_ceil(debt, p.units_per_ms())?)?;
        }
        Ok(out)
    })
}

/// Settles `hold` with `actual`: see [`super::reserve`]. The unused part comes back less
/// what was repaid since the reservation.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn settle(
    p: &GcraParams,
    rules: &Rules,
    state: Option<&GcraState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
) -> Result<Settlement<GcraState>, ModelError> {
    step(p, rules, state, now_ms, p.burst(), |now| {
        let debt = match state {
            Some(s) => repay(p, s, now)?,
            None => 0,
        };
        let elapsed = now.saturating_sub(hold.at_ms);
        let most = most_owed(p.units_per_ms());
        let (debt, change) = adjust((debt, most), hold, actual, p.interval_units(), |unused| {
            decayed(unused, p.units_per_ms(), elapsed)
        })?;
        let mut out = Evaluation::denied(now_ms, now, p.burst(), 0);
        let to_reset = div_ceil(debt, p.units_per_ms())?;
        let state = GcraState::owing(p, now, debt);
        out.allow(state, remaining(p, debt)?, to_reset)?;
        // Its deadline set, at least 1 ms away also when nothing is left counted.
        out.expire(out.reset_at_ms, None, gcra_quantum(p, rules)?, rules)?;
        Ok(change.with(out))
    })
}
