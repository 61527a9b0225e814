//! Sliding log: exact. It remembers every admitted request `(time, cost)` still inside the
//! window and admits iff the cost in `(now - W, now]` plus this cost stays within `limit`.
//!
//! - live entries: `time > now - W`;
//! - allow iff `cost <= limit - live_sum`; an allow drops the dead entries and appends
//!   `(now, cost)`, merged into the last entry when it has the same time;
//! - `retry_after`: the oldest live entries leave the window one by one; the request fits once
//!   enough have left, at `time_k + W` of the last one that had to leave;
//! - `reset_at = newest time + W`.
//!
//! An allow's key expires when its newest entry (this one) has left the window, plus the
//! cleanup grace, rounded up to a quantum (an eighth of the window, capped as the bucket's:
//! [`Evaluation::keeps_expiry`]): a write whose deadline rounds to the stored state's keeps
//! the key's expiry, so a stream of allows sets it about once a quantum.
//!
//! State: `last_ms` (time of the last allow) and the entries, oldest first. The entry count is
//! at most `limit` ([`crate::policy::SLIDING_LOG_MAX_LIMIT`] bounds it).

use super::{Evaluation, ModelError, Rules, Stored, quantum, step};
use crate::exact::{add, sub};
use crate::policy::SlidingLogParams;

/// Stored state of a sliding-log policy for one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingLogState {
    /// Effective time (Unix ms) of the last allow.
    pub last_ms: u64,
    /// `(time_ms, cost)`, strictly increasing in time, every time <= `last_ms`.
    pub entries: Vec<(u64, u64)>,
}

impl Stored for SlidingLogState {
    type Params = SlidingLogParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    fn check(&self, p: &SlidingLogParams) -> Result<(), ModelError> {
        let mut sum: u64 = 0;
        let mut prev: Option<u64> = None;
        for &(t, c) in &self.entries {
            if c == 0 || prev.is_some_and(|p| t <= p) || t > self.last_ms {
                return Err(ModelError::StateIncompatible("log entries out of order"));
            }
            sum = sum.saturating_add(c);
            prev = Some(t);
        }
        if sum > p.limit() {
            return Err(ModelError::StateIncompatible("log above limit"));
        }
        Ok(())
    }
}

/// One sliding-log step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
#[inline]
pub fn evaluate(
    p: &SlidingLogParams,
    rules: &Rules,
    state: Option<&SlidingLogState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<SlidingLogState>, ModelError> {
    evaluate_as::<true>(p, rules, state, now_ms, cost)
}

/// [`evaluate`], with the write's expiry when `EXPIRY` ([`super::decide`]).
#[inline]
pub(super) fn evaluate_as<const EXPIRY: bool>(
    p: &SlidingLogParams,
    rules: &Rules,
    state: Option<&SlidingLogState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<SlidingLogState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let (w, limit) = (p.window_ms(), p.limit());
        let entries: &[(u64, u64)] = state.map_or(&[], |s| &s.entries);
        // Entries with time + W <= now have left the window (time > now - W, without negatives).
        let mut first_live = 0;
        while first_live < entries.len() && add(entries[first_live].0, w)? <= now {
            first_live += 1;
        }
        let live = &entries[first_live..];
        let mut live_sum = 0;
        for &(_, c) in live {
            live_sum = add(live_sum, c)?;
        }
        let available = sub(limit, live_sum)?;
        let mut out = Evaluation::denied(now_ms, now, limit, available);
        out.reset_at_ms = match live.last() {
            Some(&(t, _)) => add(t, w)?,
            None => now,
        };
        if cost <= available {
            // The stored state's newest entry gave its key its deadline, as this one's does.
            let stored = match entries.last() {
                Some(&(t, _)) if EXPIRY => Some(add(t, w)?),
                _ => None,
            };
            let mut kept: Vec<(u64, u64)> = Vec::with_capacity(live.len() + 1);
            kept.extend_from_slice(live);
            match kept.last_mut() {
                Some(last) if last.0 == now => last.1 = add(last.1, cost)?,
                _ => kept.push((now, cost)),
            }
            let state = SlidingLogState {
                last_ms: now,
                entries: kept,
            };
            out.allow(state, sub(available, cost)?, w)?;
            if EXPIRY {
                out.expire(out.reset_at_ms, stored, quantum(w, rules), rules)?;
            }
            return Ok(out);
        }
        // Let the oldest entries leave until the rest plus `cost` fits.
        let mut left = live_sum;
        for &(t, c) in live {
            left = sub(left, c)?;
            if cost <= sub(limit, left)? {
                out.retry_after_ms = sub(add(t, w)?, now)?;
                break;
            }
        }
        Ok(out)
    })
}
