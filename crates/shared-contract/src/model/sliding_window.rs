//! Sliding-window counter: the previous window's count, weighted by the share of it still
//! inside the sliding window, plus the current window's count.
//!
//! With `S = 1_000_000`, `elapsed = now mod W`:
//! - `weight = ceil((W - elapsed) * S / W)` (rounded up: conservative),
//! - `estimate = ceil(previous * weight / S) + current`,
//! - allow iff `cost <= limit - estimate`.
//!
//! The answer is approximate (`ApproximateAlgorithm`): it assumes the previous window's
//! requests were spread evenly. Rounding up means it never admits more than an exact sliding
//! window would if they were. `retry_after` is the exact earliest time this estimate admits
//! the request, searched over the current and the next two windows.
//!
//! Expiry: a state stops mattering when its counts have left the sliding window (`reset_at`:
//! the end of the window after the one of `last_ms` while it counts in its own window), and
//! its key expires at `reset_at + grace` on the provider's clock. An allow into a window the
//! stored state counts in has its deadline and keeps it ([`Evaluation::keeps_expiry`]).
//!
//! State: `last_ms` (time of the last write), `previous` (count of the window before that of
//! `last_ms`), `current` (count of the window of `last_ms`) and `overdraft` (cost a
//! settlement charged past the limit in that window, see [`super::reserve`]). A window in
//! overdraft admits nothing; the overdraft counts until that window ends, and the next window
//! weighs its count at the limit.

use super::settlement::{Hold, Settlement, adjust};
use super::{Evaluation, ModelError, Rules, Stored, step};
use crate::exact::{MAX_SAFE_INTEGER, add, div, div_ceil, mul, rem, sub};
use crate::policy::{SLIDING_WINDOW_SCALE as S, SlidingWindowParams};

/// Stored state of a sliding-window-counter policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Effective time (Unix ms) of the last allow.
    pub last_ms: u64,
    /// Cost counted in the aligned window before the one of `last_ms`.
    pub previous: u64,
    /// Cost counted in the aligned window of `last_ms`, at most the limit.
    pub current: u64,
    /// Cost charged past the limit in that window (0 unless `current` is the limit).
    pub overdraft: u64,
}

impl Stored for SlidingWindowState {
    type Params = SlidingWindowParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    #[inline]
    fn check(&self, p: &SlidingWindowParams) -> Result<(), ModelError> {
        if self.previous > p.limit() || self.current > p.limit() {
            return Err(ModelError::StateIncompatible("count above limit"));
        }
        if self.overdraft > 0 && self.current != p.limit() {
            return Err(ModelError::StateIncompatible("overdraft below the limit"));
        }
        if self.overdraft > MAX_SAFE_INTEGER - p.limit() {
            return Err(ModelError::StateIncompatible("overdraft out of range"));
        }
        Ok(())
    }
}

/// Earliest offset `e` in `[from, W)` of a window where `ceil(prev * weight(e) / S) <= room`,
/// or `None` when no offset of the window qualifies.
fn first_offset(w: u64, prev: u64, room: u64, from: u64) -> Result<Option<u64>, ModelError> {
    if prev == 0 {
        return Ok(Some(from));
    }
    // ceil(prev * weight / S) <= room  <=>  weight <= floor(room * S / prev) = m.
    let m = div(mul(room, S)?, prev)?;
    if m >= S {
        return Ok(Some(from));
    }
    // ceil((W - e) * S / W) <= m  <=>  W - e <= floor(m * W / S).
    let e = sub(w, div(mul(m, w)?, S)?)?;
    Ok(if e < w { Some(e.max(from)) } else { None })
}

/// `(previous, current, overdraft)` in the window starting at `window_start` (an overdraft
/// lasts only in its own window).
fn counts(
    w: u64,
    state: Option<&SlidingWindowState>,
    window_start: u64,
) -> Result<(u64, u64, u64), ModelError> {
    Ok(match state {
        Some(s) => {
            let last_start = sub(s.last_ms, rem(s.last_ms, w)?)?;
            if last_start == window_start {
                (s.previous, s.current, s.overdraft)
            } else if add(last_start, w)? == window_start {
                (s.current, 0, 0)
            } else {
                (0, 0, 0)
            }
        }
        None => (0, 0, 0),
    })
}

/// One sliding-window step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
#[inline]
pub fn evaluate(
    p: &SlidingWindowParams,
    rules: &Rules,
    state: Option<&SlidingWindowState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<SlidingWindowState>, ModelError> {
    evaluate_as::<true>(p, rules, state, now_ms, cost)
}

/// [`evaluate`], with the write's expiry when `EXPIRY` ([`super::decide`]).
#[inline]
pub(super) fn evaluate_as<const EXPIRY: bool>(
    p: &SlidingWindowParams,
    rules: &Rules,
    state: Option<&SlidingWindowState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<SlidingWindowState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let (w, limit) = (p.window_ms(), p.limit());
        let elapsed = rem(now, w)?;
        let window_start = sub(now, elapsed)?;
        let (previous, current, _) = counts(w, state, window_start)?;
        let weight = div_ceil(mul(sub(w, elapsed)?, S)?, w)?;
        let estimate = add(div_ceil(mul(previous, weight)?, S)?, current)?;
        // Only planted state can push the estimate past the limit; it then admits nothing.
        let available = if estimate >= limit {
            0
        } else {
            sub(limit, estimate)?
        };
        let mut out = Evaluation::denied(now_ms, now, limit, available);
        if cost <= available {
            // A stored state counting in this window ends with the window after it, as this
            // one does: its key has this deadline already.
            let keeps_expiry = current > 0;
            let current = add(current, cost)?;
            let reset_at = add(window_start, mul(2, w)?)?;
            let state = SlidingWindowState {
                last_ms: now,
                previous,
                current,
                overdraft: 0,
            };
            out.allow(state, sub(available, cost)?, sub(reset_at, now)?)?;
            if EXPIRY {
                out.expire(reset_at, keeps_expiry.then_some(reset_at), 1, rules)?;
            }
            return Ok(out);
        }
        out.reset_at_ms = if current > 0 {
            add(window_start, mul(2, w)?)?
        } else if previous > 0 {
            add(window_start, w)?
        } else {
            now
        };
        // The earliest time the estimate admits `cost`, assuming no other request: later in this
        // window (only if `current` leaves room), else in the next (previous := current), else at
        // the start of the one after (both counts gone). `cost <= limit` holds by validation.
        let to_next = sub(w, elapsed)?;
        let used = add(current, cost)?;
        let in_this = if used <= limit {
            first_offset(w, previous, sub(limit, used)?, elapsed)?
        } else {
            None
        };
        out.retry_after_ms = match in_this {
            Some(e) => sub(e, elapsed)?,
            None => match first_offset(w, current, sub(limit, cost)?, 0)? {
                Some(e) => add(to_next, e)?,
                None => add(to_next, w)?,
            },
        };
        Ok(out)
    })
}

/// Settles `hold` with `actual`: see [`super::reserve`]. The unused part comes back while
/// the reservation's window is the current one.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn settle(
    p: &SlidingWindowParams,
    rules: &Rules,
    state: Option<&SlidingWindowState>,
    now_ms: u64,
    hold: &Hold,
    actual: u64,
) -> Result<Settlement<SlidingWindowState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let (w, limit) = (p.window_ms(), p.limit());
        let elapsed = rem(now, w)?;
        let start = sub(now, elapsed)?;
        let (previous, current, overdraft) = counts(w, state, start)?;
        let held = sub(hold.at_ms, rem(hold.at_ms, w)?)? == start;
        let eligible = |unused| Ok(if held { unused } else { 0 });
        let used = (add(current, overdraft)?, MAX_SAFE_INTEGER);
        let (current, change) = adjust(used, hold, actual, 1, eligible)?;
        let state = SlidingWindowState {
            last_ms: now,
            previous,
            current: current.min(limit),
            overdraft: current - current.min(limit),
        };
        let weight = div_ceil(mul(sub(w, elapsed)?, S)?, w)?;
        let estimate = add(div_ceil(mul(previous, weight)?, S)?, state.current)?;
        let remaining = limit.saturating_sub(estimate);
        let to_reset = if state.current > 0 {
            sub(add(start, mul(2, w)?)?, now)?
        } else if previous > 0 {
            sub(add(start, w)?, now)?
        } else {
            0
        };
        let mut out = Evaluation::denied(now_ms, now, limit, remaining);
        out.allow(state, remaining, to_reset)?;
        // The deadline its counts give, as an allow's (at least 1 ms away).
        out.expire(out.reset_at_ms, None, 1, rules)?;
        Ok(change.with(out))
    })
}
