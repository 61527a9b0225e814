//! Fixed window: windows aligned to the Unix epoch, `[k*W, (k+1)*W)`. An allow needs
//! `cost <= limit - consumed`; retry and reset point to the current window's end.
//!
//! State: `last_ms` (time of the last allow, whose window the count belongs to) and `count`.

use super::{EffectiveNow, Evaluation, ModelError, Rules, Verdict, check_last, effective_now};
use crate::exact::{add, rem, sub};
use crate::policy::FixedWindowParams;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    pub last_ms: u64,
    /// Cost consumed in the window of `last_ms`.
    pub count: u64,
}

impl FixedWindowState {
    fn check(&self, p: &FixedWindowParams) -> Result<(), ModelError> {
        check_last(self.last_ms)?;
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
    if let Some(s) = state {
        s.check(p)?;
    }
    let now = match effective_now(state.map(|s| s.last_ms), now_ms, rules)? {
        EffectiveNow::Safe(t) => t,
        EffectiveNow::Unsafe { last } => {
            return Ok(Evaluation::clock_unsafe(now_ms, last, p.limit()));
        }
    };
    let window_start = sub(now, rem(now, p.window_ms())?)?;
    let reset_at = add(window_start, p.window_ms())?;
    let count = match state {
        Some(s) if s.last_ms >= window_start => s.count,
        _ => 0,
    };
    let available = sub(p.limit(), count)?;
    let mut out = Evaluation {
        verdict: Verdict::Denied,
        server_now_ms: now_ms,
        effective_now_ms: now,
        limit: p.limit(),
        remaining: available,
        retry_after_ms: sub(reset_at, now)?,
        reset_at_ms: reset_at,
        new_state: None,
        ttl_ms: 0,
    };
    if cost <= available {
        let count = add(count, cost)?;
        out.verdict = Verdict::Allowed;
        out.remaining = sub(p.limit(), count)?;
        out.retry_after_ms = 0;
        out.new_state = Some(FixedWindowState {
            last_ms: now,
            count,
        });
        out.ttl_ms = add(sub(reset_at, now)?, rules.cleanup_grace_ms)?;
    }
    Ok(out)
}
