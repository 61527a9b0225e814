//! What a settlement shares across algorithms: the [`Hold`] it settles, its result
//! ([`Settlement`]) and the step around each algorithm's own arithmetic. The rules are in
//! [`super::reserve`].

use crate::exact::{MAX_SAFE_INTEGER, mul, sub};
use crate::policy::MAX_DURATION_MS;

pub use crate::reservation::Hold;

use super::{Evaluation, ModelError};

/// The result of settling a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement<S> {
    /// The state after the settlement (`Allowed`: written; `ClockUnsafe`: nothing changed),
    /// with the policy's figures after it.
    pub evaluation: Evaluation<S>,
    /// What came back, in the algorithm's units: cost for a window, `1/scale` token for a
    /// token bucket, time units for GCRA.
    pub refunded: u64,
    /// Cost charged above the estimate.
    pub overdrawn: u64,
}

impl<S> From<Evaluation<S>> for Settlement<S> {
    fn from(evaluation: Evaluation<S>) -> Self {
        Settlement {
            evaluation,
            refunded: 0,
            overdrawn: 0,
        }
    }
}

impl<S> Settlement<S> {
    /// Replaces the state type (for the [`super::AlgorithmState`] dispatcher).
    pub fn map_state<T>(self, f: impl FnOnce(S) -> T) -> Settlement<T> {
        Settlement {
            evaluation: self.evaluation.map_state(f),
            refunded: self.refunded,
            overdrawn: self.overdrawn,
        }
    }
}

/// How a settlement changed the amount a policy counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change {
    refunded: u64,
    overdrawn: u64,
}

impl Change {
    /// The settlement of `evaluation` with this change.
    pub(crate) fn with<S>(self, evaluation: Evaluation<S>) -> Settlement<S> {
        Settlement {
            evaluation,
            refunded: self.refunded,
            overdrawn: self.overdrawn,
        }
    }
}

/// The most a policy refilled (repaid) at `units_per_ms` may owe: what takes
/// [`MAX_DURATION_MS`] to pay down, so that every time derived from it stays in range.
pub(crate) fn most_owed(units_per_ms: u64) -> u64 {
    units_per_ms
        .saturating_mul(MAX_DURATION_MS)
        .min(MAX_SAFE_INTEGER)
}

/// The step every algorithm's settlement shares: `used` is what the policy counts now, in
/// `unit`s per cost, at most `most`; `eligible` says how much of an unused part (in units)
/// the algorithm still holds. Returns the new amount counted.
pub(crate) fn adjust(
    (used, most): (u64, u64),
    hold: &Hold,
    actual: u64,
    unit: u64,
    eligible: impl FnOnce(u64) -> Result<u64, ModelError>,
) -> Result<(u64, Change), ModelError> {
    if actual >= hold.estimate {
        let overdrawn = sub(actual, hold.estimate)?;
        let more = mul(overdrawn, unit)?;
        let used = used.saturating_add(more).min(most);
        return Ok((
            used,
            Change {
                refunded: 0,
                overdrawn,
            },
        ));
    }
    let unused = mul(sub(hold.estimate, actual)?, unit)?;
    let refunded = eligible(unused)?.min(unused).min(used);
    Ok((
        sub(used, refunded)?,
        Change {
            refunded,
            overdrawn: 0,
        },
    ))
}

/// `max(0, amount - rate * elapsed)`, forming the product only when it is smaller.
pub(crate) fn decayed(amount: u64, rate: u64, elapsed: u64) -> Result<u64, ModelError> {
    if elapsed >= amount.div_ceil(rate) {
        Ok(0)
    } else {
        Ok(sub(amount, mul(elapsed, rate)?)?)
    }
}
