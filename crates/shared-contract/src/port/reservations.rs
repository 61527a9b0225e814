//! What the port's reservation calls take and answer
//! ([`EdgeRateLimitPort::reserve`](crate::EdgeRateLimitPort::reserve), `settle`, `cancel`).
//!
//! The answers are honest outcomes ([`Outcome`]): `Evaluated` carries what the provider knows
//! (for settle and cancel, either the result or the [`ReservationError`] the reservation's
//! life refuses it with, nothing charged); the failures are those of an evaluation.

use crate::decision::{Outcome, RateLimitDecision};
use crate::ids::Deadline;
use crate::reservation::{ReservationError, ReservationId, ReservationTtl};

use super::multi::{Limits, MultiDecision};

/// Reserve each limit's cost as its estimate, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    /// The limits; each cost is the estimate.
    pub limits: Limits,
    /// How long the reservation waits for its settlement.
    pub ttl: ReservationTtl,
    /// When the caller stops waiting.
    pub deadline: Deadline,
}

/// The answer to a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// The evaluation of the estimates (`allowed: false` reserved nothing).
    pub decision: MultiDecision,
    /// The reservation, exactly when the decision admitted.
    pub id: Option<ReservationId>,
    /// Milliseconds until the reservation expires (its ttl), 0 when nothing was reserved.
    pub expires_in_ms: u64,
}

/// The honest result of a reservation.
pub type ReserveOutcome = Outcome<Reserved>;

/// Settle a reservation with the actual costs, one per limit in request order (0 for a limit
/// the work did not use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    /// The reservation.
    pub id: ReservationId,
    /// The actual costs, each `0..=max_cost` of its policy.
    pub actual: Vec<u64>,
    /// When the caller stops waiting.
    pub deadline: Deadline,
}

/// A settlement, as first answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// What the reservation charged per limit: the actual costs.
    pub charged: Vec<u64>,
    /// Each limit's figures after the settlement (`allowed` is true: a settlement is never
    /// denied).
    pub decisions: Vec<RateLimitDecision>,
    /// This is the answer of an earlier settle, repeated: nothing was charged now.
    pub replayed: bool,
}

/// The honest result of a settle.
pub type SettleOutcome = Outcome<Result<Settled, ReservationError>>;

/// Cancel a reservation: its estimates are refunded (as far as the policies still hold them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    /// The reservation.
    pub id: ReservationId,
    /// When the caller stops waiting.
    pub deadline: Deadline,
}

/// A cancellation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// The reservation was cancelled earlier: nothing was refunded now.
    pub replayed: bool,
}

/// The honest result of a cancel.
pub type CancelOutcome = Outcome<Result<Cancelled, ReservationError>>;
