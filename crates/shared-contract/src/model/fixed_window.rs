//! Fixed window: windows aligned to the Unix epoch, `[k*W, (k+1)*W)`, or calendar periods
//! ([`crate::policy::calendar`]). An allow needs `cost <= limit - consumed`; retry and reset
//! point to the current window's end.
//!
//! State: `last_ms` (time of the last write, whose window the count belongs to), `count` and
//! `overdraft` (cost a settlement charged past the limit in that window; see
//! [`super::reserve`]). A window in overdraft admits nothing until it ends; the next window
//! starts empty.
//!
//! Expiry: every write of a window sets one deadline on the provider's clock, the window's
//! end plus the cleanup grace (`ttl_ms = reset_at + grace - server_now`; under a clock
//! regression that is longer than from the effective time, never shorter). So a write into
//! the window the stored state belongs to finds the deadline already set and keeps it
//! ([`Evaluation::keeps_expiry`]), and expiry can never be seen: at the deadline the window
//! is over and the state decides like no state.

use super::settlement::{Hold, Settlement, adjust};
use super::{Evaluation, ModelError, Rules, Stored, step};
use crate::exact::{MAX_SAFE_INTEGER, add, rem, sub};
use crate::policy::FixedWindowParams;

/// Stored state of a fixed-window policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Effective time (Unix ms) of the last write; `count` belongs to its window.
    pub last_ms: u64,
    /// Cost consumed in the window of `last_ms`, at most the limit.
    pub count: u64,
    /// Cost charged past the limit in that window (0 unless `count` is the limit).
    pub overdraft: u64,
}

impl Stored for FixedWindowState {
    type Params = FixedWindowParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    #[inline]
    fn check(&self, p: &FixedWindowParams) -> Result<(), ModelError> {
        if self.count > p.limit() {
            return Err(ModelError::StateIncompatible("count above limit"));
        }
        if self.overdraft > 0 && self.count != p.limit() {
            return Err(ModelError::StateIncompatible("overdraft below the limit"));
        }
        if self.overdraft > MAX_SAFE_INTEGER - p.limit() {
            return Err(ModelError::StateIncompatible("overdraft out of range"));
        }
        Ok(())
    }
}

/// The window holding `t`: `[start, end)`, from the epoch or the calendar.
fn bounds(p: &FixedWindowParams, t: u64) -> Result<(u64, u64), ModelError> {
    match p.calendar() {
        Some(c) => c.bounds(t).ok_or(ModelError::ClockOutOfRange(t)),
        None => {
            let start = sub(t, rem(t, p.window_ms())?)?;
            Ok((start, add(start, p.window_ms())?))
        }
    }
}

/// Cost counted in the window starting at `start` (count plus overdraft; 0 when the state
/// belongs to an earlier window).
fn used(state: Option<&FixedWindowState>, start: u64) -> Result<u64, ModelError> {
    Ok(match state {
        Some(s) if s.last_ms >= start => add(s.count, s.overdraft)?,
        _ => 0,
    })
}

/// Whether `state` belongs to the window starting at `start` (then its key expires at the
/// window's deadline already).
fn state_in_window(state: Option<&FixedWindowState>, start: u64) -> bool {
    state.is_some_and(|s| s.last_ms >= start)
}

/// One fixed-window step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
#[inline]
pub fn evaluate(
    p: &FixedWindowParams,
    rules: &Rules,
    state: Option<&FixedWindowState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<FixedWindowState>, ModelError> {
    evaluate_as::<true>(p, rules, state, now_ms, cost)
}

/// [`evaluate`], with the write's expiry when `EXPIRY` ([`super::decide`]).
#[inline]
pub(super) fn evaluate_as<const EXPIRY: bool>(
    p: &FixedWindowParams,
    rules: &Rules,
    state: Option<&FixedWindowState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<FixedWindowState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let (start, reset_at) = bounds(p, now)?;
        let count = used(state, start)?.min(p.limit());
        let available = sub(p.limit(), count)?;
        let mut out = Evaluation::denied(now_ms, now, p.limit(), available);
        let to_reset = sub(reset_at, now)?;
        out.retry_after_ms = to_reset;
        out.reset_at_ms = reset_at;
        if cost <= available {
            // A state of this window ends with it; an earlier one's deadline has another end.
            let keeps_expiry = state_in_window(state, start);
            let count = add(count, cost)?;
            let state = FixedWindowState {
                last_ms: now,
                count,
                overdraft: 0,
            };
            out.allow(state, sub(p.limit(), count)?, to_reset)?;
            if EXPIRY {
                out.expire(reset_at, keeps_expiry.then_some(reset_at), 1, rules)?;
            }
        }
        Ok(out)
    })
}

/// Settles `hold` with `actual` (see [`super::reserve`]): the unused estimate comes back only
/// while the reservation's window lasts (a later window never held it); cost above the
/// estimate is charged to the current window, past the limit if need be.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn settle(
    p: &FixedWindowParams,
    rules: &Rules,
    state: Option<&FixedWindowState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
) -> Result<Settlement<FixedWindowState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let (start, reset_at) = bounds(p, now)?;
        // A hold the calendar cannot place (no reservation's time) is not of this window.
        let held = bounds(p, hold.at_ms).is_ok_and(|b| b.0 == start);
        let (used, change) = adjust(
            (used(state, start)?, MAX_SAFE_INTEGER),
            hold,
            actual,
            1,
            |r| Ok(if held { r } else { 0 }),
        )?;
        let count = used.min(p.limit());
        let state = FixedWindowState {
            last_ms: now,
            count,
            overdraft: used - count,
        };
        let mut out = Evaluation::denied(now_ms, now, p.limit(), sub(p.limit(), count)?);
        let to_reset = sub(reset_at, now)?;
        out.allow(state, sub(p.limit(), count)?, to_reset)?;
        // The window's one deadline, also for a settlement that leaves nothing counted. A
        // settlement sets it rather than keep it.
        out.expire(reset_at, None, 1, rules)?;
        Ok(change.with(out))
    })
}
