//! The event-gate port every gate provider implements, and the honest outcome it answers.
//!
//! Like the rate-limit port it is async, object safe (`Arc<dyn EventGatePort>`) and chosen at
//! run time. A rejection is an answer, not a failure: it comes as
//! `Evaluated(SubmitOutcome::Rejected { .. })`. A provider that could not answer says how much
//! it knows (`Unavailable`: nothing changed; `Indeterminate`: the submission may or may not
//! have taken effect, and retrying it with the same id is safe because a known id is answered
//! as a duplicate).
//!
//! Subscription stays runtime-free: [`EventGatePort::updates_after`] is a pull with a cursor
//! (the last clock the subscriber has) that waits up to a deadline for the next updates. A
//! provider built on a Redis Stream or an in-memory ring buffer implements it directly, and a
//! fan-out task turns it into WebSocket frames at the edge.

use std::num::NonZeroUsize;

use super::ids::{EventId, EventKey, GateClock, GateId};
use super::model::{EventRecord, GateError, Snapshot, StatusUpdate, SubmitOutcome};
use super::settings::{GateSet, GateSettings};
use crate::decision::{IncompatibleCategory, UnavailableCategory};
use crate::ids::Deadline;
use crate::port::Readiness;

/// One event to submit to one gate. The edge makes an id when the client sent none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitRequest {
    /// The gate to submit to.
    pub gate: GateId,
    /// The key that decides which events conflict.
    pub key: EventKey,
    /// Names the event; a retry with the same id is answered as a duplicate.
    pub id: EventId,
    /// When the caller needs the answer by.
    pub deadline: Deadline,
}

/// A request no provider may act on. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateRequestError {
    /// No gate of this id is configured.
    #[error("unknown gate {0}")]
    UnknownGate(GateId),
}

/// The honest result of one gate operation. Only `Evaluated` carries an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateOutcome<T> {
    /// The gate answered; for a submission, a rejection is an answer too.
    Evaluated(T),
    /// Known: nothing changed (not connected, admission bound or `max_events` reached, clock
    /// unsafe, deadline too short, ...).
    Unavailable {
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
        /// Why nothing was done.
        category: UnavailableCategory,
    },
    /// Sent, result unknown: the operation may or may not have taken effect. Reads never
    /// answer this (a failed read changed nothing, so it is `Unavailable`).
    Indeterminate {
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
    },
    /// Stored state, program or reply do not fit what this build expects.
    Incompatible {
        /// What did not fit.
        category: IncompatibleCategory,
    },
}

impl<T> GateOutcome<T> {
    /// The outcome's name as reported on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            GateOutcome::Evaluated(_) => "evaluated",
            GateOutcome::Unavailable { .. } => "unavailable",
            GateOutcome::Indeterminate { .. } => "indeterminate",
            GateOutcome::Incompatible { .. } => "incompatible",
        }
    }

    /// The answer, when there is one.
    pub fn evaluated(&self) -> Option<&T> {
        match self {
            GateOutcome::Evaluated(v) => Some(v),
            _ => None,
        }
    }

    /// Replaces the answer type, keeping any failure as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> GateOutcome<U> {
        match self {
            GateOutcome::Evaluated(v) => GateOutcome::Evaluated(f(v)),
            GateOutcome::Unavailable {
                retry_after_ms,
                category,
            } => GateOutcome::Unavailable {
                retry_after_ms,
                category,
            },
            GateOutcome::Indeterminate { retry_after_ms } => {
                GateOutcome::Indeterminate { retry_after_ms }
            }
            GateOutcome::Incompatible { category } => GateOutcome::Incompatible { category },
        }
    }
}

impl GateError {
    /// Suggested wait after a refusal whose end the gate cannot predict (`Full`).
    pub const RETRY_AFTER_MS: u64 = 1000;

    /// How a provider reports this model refusal. Every `GateError` means nothing changed, so
    /// none of them is `Indeterminate`.
    pub fn outcome<T>(&self) -> GateOutcome<T> {
        match self {
            GateError::ClockBehind {
                now_ms, last_ms, ..
            } => GateOutcome::Unavailable {
                // The provider clock has to catch up with the gate's time.
                retry_after_ms: last_ms.saturating_sub(*now_ms),
                category: UnavailableCategory::Clock,
            },
            GateError::TimeOutOfRange(_) => GateOutcome::Unavailable {
                retry_after_ms: Self::RETRY_AFTER_MS,
                category: UnavailableCategory::Clock,
            },
            GateError::Full { .. } => GateOutcome::Unavailable {
                retry_after_ms: Self::RETRY_AFTER_MS,
                category: UnavailableCategory::Admission,
            },
            GateError::ClockExhausted
            | GateError::OutOfRange(_)
            | GateError::StateIncompatible(_) => GateOutcome::Incompatible {
                category: IncompatibleCategory::State,
            },
        }
    }
}

/// The answer to [`EventGatePort::updates_after`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateBatch {
    /// Updates with a clock above the cursor, in clock order, at most the requested number;
    /// empty when none came before the deadline.
    Updates(Vec<StatusUpdate>),
    /// The updates after the cursor are no longer kept (or the gate's clock is behind the
    /// cursor, as after a reset): take a snapshot and continue from its clock.
    Resync,
}

impl GateSet {
    /// The settings of `gate`, after the check every provider makes before touching state.
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    pub fn admit(&self, gate: &GateId) -> Result<&GateSettings, GateRequestError> {
        self.get(gate)
            .ok_or_else(|| GateRequestError::UnknownGate(gate.clone()))
    }
}

/// The event-gate port: "let this event through only once per duration, and tell everyone
/// what became of it".
///
/// Object safe and used as `Arc<dyn EventGatePort>`. Implementations never panic, follow
/// [`super::GateState`] exactly, and never answer a submission they do not know to be one.
#[async_trait::async_trait]
pub trait EventGatePort: Send + Sync + std::fmt::Debug {
    /// The gates this provider serves.
    fn gates(&self) -> &GateSet;

    /// Submits one event.
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`]; nothing changed.
    async fn submit(
        &self,
        request: SubmitRequest,
    ) -> Result<GateOutcome<SubmitOutcome>, GateRequestError>;

    /// The event with `id`, or `None` when the gate does not hold it (never submitted,
    /// rejected, or removed after its retention).
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    async fn event(
        &self,
        gate: &GateId,
        id: &EventId,
        deadline: Deadline,
    ) -> Result<GateOutcome<Option<EventRecord>>, GateRequestError>;

    /// The incubating events and the clock they were read at, in due order.
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    async fn snapshot(
        &self,
        gate: &GateId,
        deadline: Deadline,
    ) -> Result<GateOutcome<Snapshot>, GateRequestError>;

    /// Up to `max` status updates with a clock above `after`, in clock order; waits until at
    /// least one exists or `deadline` is near (then answers an empty batch).
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    async fn updates_after(
        &self,
        gate: &GateId,
        after: GateClock,
        max: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<UpdateBatch>, GateRequestError>;

    /// Publishes up to `max_batch` events whose publish time has passed, by the provider's
    /// clock; answers how many. Providers run this from their background publisher; calling
    /// it from anywhere, from several instances at once, is safe: each event is published
    /// exactly once.
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    async fn publish_due(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError>;

    /// Removes up to `max_batch` terminal events past their retention (the conditional
    /// delete) and lapsed key windows; answers how many events were removed.
    ///
    /// # Errors
    /// [`GateRequestError::UnknownGate`].
    async fn sweep(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError>;

    /// Whether the provider can serve gates now.
    async fn readiness(&self) -> Readiness {
        Readiness::Ready
    }
}
