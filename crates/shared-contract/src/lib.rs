//! The provider-neutral contract of the rate-limiting toolkit.
//!
//! Everything a service, an adapter or a test needs to agree on lives here, and nothing
//! else: validated request values ([`ids`]), policies ([`policy`]), decisions and honest
//! outcomes ([`decision`]), the async port ([`port`]), injected time ([`clock`]), exact
//! integer arithmetic ([`exact`]), concurrency leases ([`lease`]), reservations
//! ([`reservation`]) and the reference semantics of every algorithm ([`model`]).
//!
//! The key design decision: **the models are the single source of truth.** The local
//! provider runs them directly; the Redis Lua programs mirror them step for step and are
//! property-tested against them. A decision is therefore the same whichever provider makes it.
//!
//! This crate depends on no other workspace crate and on no runtime, driver or serialization
//! library (no tokio, redis, axum or serde): adapters convert at their edges.

#![warn(missing_docs)]

pub mod clock;
pub mod decision;
pub mod exact;
pub mod gate;
pub mod ids;
pub mod lease;
pub mod model;
pub mod policy;
pub mod port;
pub mod reservation;
#[cfg(feature = "testing")]
pub mod testing;

pub use port::multi;

pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{
    Certainty, FleetShare, IncompatibleCategory, Outcome, RateLimitDecision, RateLimitOutcome,
    Source, UnavailableCategory,
};
pub use gate::{
    EventGatePort, EventId, EventKey, EventStatus, GateClock, GateId, GateMode, GateOutcome,
    GateSet, GateSettings, GateSpec, GateState,
};
pub use ids::{Cost, Deadline, EvaluationId, IdError, PolicyId, PolicyRevision, SubjectDigest};
pub use lease::{
    AcquireOutcome, AcquireRequest, Lease, LeaseId, LeaseIdError, LeaseToken, RandomTokens,
    ReleaseOutcome, ReleaseRequest, SequenceTokens, TokenSource,
};
pub use multi::{Limit, Limits, MAX_LIMITS, MultiDecision, MultiOutcome, MultiRequest};
pub use policy::{
    Algorithm, AlgorithmKind, AlgorithmSpec, FailurePolicy, MIN_COUNT, PolicyBuilder, PolicyError,
    PolicyErrors, PolicySpec, RateLimitPolicy,
};
pub use port::reservations::{
    CancelOutcome, CancelRequest, Cancelled, ChargeLimit, ChargeOutcome, ChargeRequest,
    ReserveOutcome, ReserveRequest, Reserved, SettleOutcome, SettleRequest, Settled,
};
pub use port::{
    EdgeRateLimitPort, PolicySet, PolicySetError, RateLimitRequest, Readiness, RequestError,
};
pub use reservation::{ReservationError, ReservationId, ReservationTtl};
