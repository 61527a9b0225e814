//! What an evaluation answers: a decision when the provider evaluated the request, or an
//! honest account of why it could not. A denial is a decision, not an error.

use crate::ids::{PolicyId, PolicyRevision};

/// Who made the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The shared Redis state: one answer across every instance.
    GlobalRedis,
    /// This process's exact denial cache: a denial the shared state is known to repeat
    /// ([`crate::model::DenialBound`]), answered without a call.
    LocalCache,
    /// This process's memory (the local provider).
    Local,
    /// This process's memory, standing in for an unavailable global provider.
    LocalFallback,
}

impl Source {
    /// The source's name as reported on the wire and in metrics (`global_redis`, `local_cache`,
    /// `local`, `local_fallback`).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::GlobalRedis => "global_redis",
            Source::LocalCache => "local_cache",
            Source::Local => "local",
            Source::LocalFallback => "local_fallback",
        }
    }
}

/// How exact the decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Certainty {
    /// Exactly the algorithm's answer over the whole shared state.
    Certain,
    /// The algorithm itself estimates (sliding-window counter).
    ApproximateAlgorithm,
    /// A local stand-in decided: N instances may admit up to N times the limit.
    ApproximateFallback,
}

impl Certainty {
    /// The certainty's name as reported on the wire and in metrics (`certain`,
    /// `approximate_algorithm`, `approximate_fallback`).
    pub fn as_str(self) -> &'static str {
        match self {
            Certainty::Certain => "certain",
            Certainty::ApproximateAlgorithm => "approximate_algorithm",
            Certainty::ApproximateFallback => "approximate_fallback",
        }
    }
}

/// An allow or a deny, with what a client needs to behave well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitDecision {
    /// Whether the request was admitted; a denial consumed nothing.
    pub allowed: bool,
    /// The most cost admissible at once (limit, capacity or burst).
    pub limit: u64,
    /// Cost still admissible now, after this request.
    pub remaining: u64,
    /// Milliseconds until this request (alone) could be admitted; 0 when allowed.
    pub retry_after_ms: u64,
    /// Unix ms, by the provider's clock, when the full quota is available again.
    pub reset_at_ms: u64,
    /// The policy this decision is for.
    pub policy_id: PolicyId,
    /// The policy revision whose state decided.
    pub revision: PolicyRevision,
    /// Which provider, or which stand-in for it, made the decision.
    pub source: Source,
    /// How exact the decision is.
    pub certainty: Certainty,
}

/// Why a provider could not even try: known before anything was sent, or the server clock is
/// unsafe. Nothing was mutated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnavailableCategory {
    /// Not connected, or the connection failed before the request was written.
    Connect,
    /// The admission bound (`max_in_flight`) was reached.
    Admission,
    /// The caller's deadline is shorter than the provider needs.
    Deadline,
    /// The server clock went back beyond the policy's `max_clock_regression`.
    Clock,
    /// A circuit breaker is open after repeated failures.
    CircuitOpen,
    /// The server refused before running anything (loading, out of memory, read-only replica).
    Server,
}

impl UnavailableCategory {
    /// The category's name as reported on the wire and in metrics (`connect`, `admission`,
    /// `deadline`, `clock`, `circuit_open`, `server`).
    pub fn as_str(self) -> &'static str {
        match self {
            UnavailableCategory::Connect => "connect",
            UnavailableCategory::Admission => "admission",
            UnavailableCategory::Deadline => "deadline",
            UnavailableCategory::Clock => "clock",
            UnavailableCategory::CircuitOpen => "circuit_open",
            UnavailableCategory::Server => "server",
        }
    }
}

/// Why state, program or reply do not fit what this build expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IncompatibleCategory {
    /// Stored state has another schema, algorithm, revision, type or a malformed field.
    State,
    /// The program is missing, different, or refused by the server (permissions, version).
    Program,
    /// The reply has an unknown shape, status, or a value out of range.
    Reply,
}

impl IncompatibleCategory {
    /// The category's name as reported on the wire and in metrics (`state`, `program`, `reply`).
    pub fn as_str(self) -> &'static str {
        match self {
            IncompatibleCategory::State => "state",
            IncompatibleCategory::Program => "program",
            IncompatibleCategory::Reply => "reply",
        }
    }
}

/// The honest result of an evaluation. Only `Evaluated` carries an allow or a deny; the
/// other variants say what is known about the state, never an allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitOutcome {
    /// The provider evaluated the request: an allow or a deny.
    Evaluated(RateLimitDecision),
    /// Known: nothing was mutated.
    Unavailable {
        /// The policy that could not be evaluated.
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense (for `Clock`: until the server clock
        /// is back at the state's last write).
        retry_after_ms: u64,
        /// Why nothing was tried.
        category: UnavailableCategory,
    },
    /// Sent, result unknown: the request may or may not have consumed quota.
    Indeterminate {
        /// The policy whose evaluation may or may not have happened.
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
    },
    /// State, program or reply mismatch.
    Incompatible {
        /// The policy whose state, program or reply did not fit.
        policy_id: PolicyId,
        /// What did not fit.
        category: IncompatibleCategory,
    },
}

impl RateLimitOutcome {
    /// The policy this outcome is for, whichever the variant.
    pub fn policy_id(&self) -> &PolicyId {
        match self {
            RateLimitOutcome::Evaluated(d) => &d.policy_id,
            RateLimitOutcome::Unavailable { policy_id, .. }
            | RateLimitOutcome::Indeterminate { policy_id, .. }
            | RateLimitOutcome::Incompatible { policy_id, .. } => policy_id,
        }
    }

    /// The decision, when there is one.
    pub fn decision(&self) -> Option<&RateLimitDecision> {
        match self {
            RateLimitOutcome::Evaluated(d) => Some(d),
            _ => None,
        }
    }

    /// The outcome's name as reported on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            RateLimitOutcome::Evaluated(_) => "evaluated",
            RateLimitOutcome::Unavailable { .. } => "unavailable",
            RateLimitOutcome::Indeterminate { .. } => "indeterminate",
            RateLimitOutcome::Incompatible { .. } => "incompatible",
        }
    }

    /// Why no decision was made, as the `category` of the provider-error metric: the
    /// unavailable or incompatible category, or `indeterminate`; `None` for a decision.
    pub fn error_category(&self) -> Option<&'static str> {
        match self {
            RateLimitOutcome::Evaluated(_) => None,
            RateLimitOutcome::Unavailable { category, .. } => Some(category.as_str()),
            RateLimitOutcome::Indeterminate { .. } => Some("indeterminate"),
            RateLimitOutcome::Incompatible { category, .. } => Some(category.as_str()),
        }
    }
}
