//! Fixed window: windows aligned to the Unix epoch, `[k*W, (k+1)*W)`. An allow needs
//! `cost <= limit - consumed`; retry and reset point to the current window's end.
//!
//! State: `last_ms` (time of the last allow, whose window the count belongs to) and `count`.

use super::{Evaluation, ModelError, Rules, Stored, step};
use crate::exact::{add, rem, sub};
use crate::policy::FixedWindowParams;

/// Stored state of a fixed-window policy for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Effective time (Unix ms) of the last allow; `count` belongs to its window.
    pub last_ms: u64,
    /// Cost consumed in the window of `last_ms`.
    pub count: u64,
}

impl Stored for FixedWindowState {
    type Params = FixedWindowParams;

    fn last_ms(&self) -> u64 {
        self.last_ms
    }

    fn check(&self, p: &FixedWindowParams) -> Result<(), ModelError> {
        if self.count > p.limit() {
            return Err(ModelError::StateIncompatible("count above limit"));
        }
        Ok(())
    }
}

/// One fixed-window step. See the module docs.
///
/// # Errors
/// [`ModelError`] when state does not fit `p` or the clock is out of range.
pub fn evaluate(
    p: &FixedWindowParams,
    rules: &Rules,
    state: Option<&FixedWindowState>,
    now_ms: u64,
    cost: u64,
) -> Result<Evaluation<FixedWindowState>, ModelError> {
    step(p, rules, state, now_ms, p.limit(), |now| {
        let window_start = sub(now, rem(now, p.window_ms())?)?;
        let reset_at = add(window_start, p.window_ms())?;
        let count = match state {
            Some(s) if s.last_ms >= window_start => s.count,
            _ => 0,
        };
        let available = sub(p.limit(), count)?;
        let mut out = Evaluation::denied(now_ms, now, p.limit(), available);
        let to_reset = sub(reset_at, now)?;
        out.retry_after_ms = to_reset;
        out.reset_at_ms = reset_at;
        if cost <= available {
            let count = add(count, cost)?;
            let state = FixedWindowState {
                last_ms: now,
                count,
            };
            out.allow(state, sub(p.limit(), count)?, to_reset, rules)?;
        }
        Ok(out)
    })
}
