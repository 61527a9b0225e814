//! What the port's reservation calls take and answer
//! ([`EdgeRateLimitPort::reserve`](crate::EdgeRateLimitPort::reserve), `settle`, `cancel`).
//!
//! The answers are honest outcomes ([`Outcome`]): `Evaluated` carries what the provider knows
//! (for settle and cancel, either the result or the [`ReservationError`] the reservation's
//! life refuses it with, nothing charged); the failures are those of an evaluation.

use crate::decision::{Outcome, RateLimitDecision};
use crate::ids::{Deadline, PolicyId, SubjectDigest};
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

/// One limit of a charge after the work: its policy, subject and cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeLimit {
    /// The policy charged.
    pub policy_id: PolicyId,
    /// The subject charged.
    pub subject: SubjectDigest,
    /// `0`: a check (would a cost of 1 be admitted? nothing charged); above 0: the cost, charged
    /// past the limit if need be (at most the policy's `max_cost`).
    pub cost: u64,
}

/// Checks and charges after the work, for a caller that learns the cost only when the work
/// is done and cannot hold a reservation in between (Envoy's stream-done call): see
/// [`EdgeRateLimitPort::charge`](crate::EdgeRateLimitPort::charge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    /// 1..=[`MAX_LIMITS`](crate::MAX_LIMITS) limits, no policy and subject twice.
    pub limits: Vec<ChargeLimit>,
    /// When the caller stops waiting.
    pub deadline: Deadline,
}

/// The honest result of a charge: one decision per limit, in order. A check's decision is
/// the evaluation of a cost of 1 (nothing written); a charge's says `allowed` (never denied)
/// with the figures after it. `allowed` is whether every check admitted.
pub type ChargeOutcome = Outcome<MultiDecision>;
