//! Reservations at the edge: the [`Limiter`]'s reserve, settle and cancel (a cost known after
//! the work), with a deadline, metrics and a tracing span (never the subject), for the HTTP
//! API and the middleware.
//!
//! A reservation's evaluation of its estimates counts in the decision metrics like an
//! evaluation of several limits. `rate_limit_reservations_total{operation, outcome}` counts
//! every call: `operation` is `reserve`, `settle`, `cancel` or `charge` (after the work);
//! `outcome` is `reserved`, `denied`, `settled`, `cancelled`, `replayed`, `charged`,
//! `not_found`, `expired`, `conflict` (settle after cancel, cancel after settle), `invalid`
//! (the actual costs), or the failure's name.

use std::time::Instant;

use shared_contract::{
    CancelOutcome, CancelRequest, ChargeLimit, ChargeOutcome, ChargeRequest, Limit, Limits,
    MultiOutcome, Outcome, RequestError, ReservationError, ReservationId, ReservationTtl,
    ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest,
};
use tracing::Instrument as _;

use crate::limiter::{Limiter, Member, PolicyIndex};

/// Metric names of the reservations, as `/metrics` shows them.
pub mod names {
    /// Reserve, settle and cancel calls, by `operation` and `outcome`.
    pub const RESERVATIONS: &str = "rate_limit_reservations_total";
}

fn count(operation: &'static str, outcome: &'static str) {
    metrics::counter!(names::RESERVATIONS, "operation" => operation, "outcome" => outcome)
        .increment(1);
}

/// The metric's name for what the reservation's life refused.
fn refused(e: &ReservationError) -> &'static str {
    match e {
        ReservationError::Unknown => "not_found",
        ReservationError::Expired { .. } => "expired",
        ReservationError::Cancelled | ReservationError::Settled => "conflict",
        _ => "invalid",
    }
}

impl Limiter {
    /// Reserves each member's cost as its estimate, all or nothing, for `ttl`.
    ///
    /// # Errors
    /// As [`Self::evaluate_all`], and what the port refuses of a reservation (a sliding-log
    /// policy, too many held, a provider without reservations); nothing was reserved.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub async fn reserve(
        &self,
        members: &[Member],
        ttl: ReservationTtl,
    ) -> Result<ReserveOutcome, RequestError> {
        let start = Instant::now();
        let limits = members
            .iter()
            .map(|m| Limit {
                policy_id: self.policy(m.index).id().clone(),
                subject: m.subject,
                cost: m.cost,
            })
            .collect();
        let request = ReserveRequest {
            limits: Limits::new(limits)?,
            ttl,
            deadline: self.deadline(start),
        };
        let span = tracing::debug_span!("rate_limit.reserve", limits = members.len());
        let outcome = self.port().reserve(request).instrument(span).await?;
        let evaluation: MultiOutcome = match outcome.clone().decided() {
            Ok(reserved) => Outcome::Evaluated(reserved.decision),
            Err(failure) => failure,
        };
        self.record_members(members, &evaluation, start.elapsed().as_secs_f64());
        count(
            "reserve",
            match &outcome {
                Outcome::Evaluated(r) if r.id.is_some() => "reserved",
                Outcome::Evaluated(_) => "denied",
                failure => failure.name(),
            },
        );
        Ok(outcome)
    }

    /// Settles reservation `id` with the `actual` costs, one per limit in request order.
    ///
    /// # Errors
    /// What the port refuses (a provider without reservations); nothing was charged.
    pub async fn settle(
        &self,
        id: ReservationId,
        actual: Vec<u64>,
    ) -> Result<SettleOutcome, RequestError> {
        let request = SettleRequest {
            id,
            actual,
            deadline: self.deadline(Instant::now()),
        };
        let span = tracing::debug_span!("rate_limit.settle");
        let outcome = self.port().settle(request).instrument(span).await?;
        count(
            "settle",
            match &outcome {
                Outcome::Evaluated(Ok(s)) if s.replayed => "replayed",
                Outcome::Evaluated(Ok(_)) => "settled",
                Outcome::Evaluated(Err(e)) => refused(e),
                failure => failure.name(),
            },
        );
        Ok(outcome)
    }

    /// Checks (cost 0) and charges (past the limit if need be) `limits` after the work: see
    /// [`ChargeRequest`]. The call counts in `rate_limit_reservations_total{operation="charge"}`.
    ///
    /// # Errors
    /// What the port refuses; nothing was charged.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub async fn charge(
        &self,
        limits: &[(PolicyIndex, shared_contract::SubjectDigest, u64)],
    ) -> Result<ChargeOutcome, RequestError> {
        let request = ChargeRequest {
            limits: limits
                .iter()
                .map(|&(index, subject, cost)| ChargeLimit {
                    policy_id: self.policy(index).id().clone(),
                    subject,
                    cost,
                })
                .collect(),
            deadline: self.deadline(Instant::now()),
        };
        let span = tracing::debug_span!("rate_limit.charge", limits = limits.len());
        let outcome = self.port().charge(request).instrument(span).await?;
        count(
            "charge",
            match &outcome {
                Outcome::Evaluated(d) if d.allowed => "charged",
                Outcome::Evaluated(_) => "denied",
                failure => failure.name(),
            },
        );
        Ok(outcome)
    }

    /// Cancels reservation `id`, refunding its estimates.
    ///
    /// # Errors
    /// As [`Self::settle`].
    pub async fn cancel(&self, id: ReservationId) -> Result<CancelOutcome, RequestError> {
        let request = CancelRequest {
            id,
            deadline: self.deadline(Instant::now()),
        };
        let span = tracing::debug_span!("rate_limit.cancel");
        let outcome = self.port().cancel(request).instrument(span).await?;
        count(
            "cancel",
            match &outcome {
                Outcome::Evaluated(Ok(c)) if c.replayed => "replayed",
                Outcome::Evaluated(Ok(_)) => "cancelled",
                Outcome::Evaluated(Err(e)) => refused(e),
                failure => failure.name(),
            },
        );
        Ok(outcome)
    }
}
