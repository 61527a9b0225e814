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
    /// For a `local_fallback` decision with a known fleet: the share of the limit this
    /// instance admits while the global provider is unavailable, and the fleet size it was
    /// divided by. `None` for every other decision.
    pub fleet: Option<FleetShare>,
}

/// The fleet-bounded fallback's share behind a decision: each of `size` instances admits at
/// most `share` (the policy's limit, capacity or burst divided by `size`, rounded down), so
/// the fleet admits at most the limit while the global provider is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetShare {
    /// The limit (or capacity, or burst) this instance admits on its own.
    pub share: u64,
    /// The live instances of the fleet, as last known (or the configured size when none was
    /// known yet).
    pub size: u64,
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
    /// Every category, in declaration order (a unit test holds it to the enum): what a metric
    /// needs to register one series per category before any is seen.
    pub const ALL: [UnavailableCategory; 6] = [
        UnavailableCategory::Connect,
        UnavailableCategory::Admission,
        UnavailableCategory::Deadline,
        UnavailableCategory::Clock,
        UnavailableCategory::CircuitOpen,
        UnavailableCategory::Server,
    ];

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
    /// Every category, in declaration order (as [`UnavailableCategory::ALL`]).
    pub const ALL: [IncompatibleCategory; 3] = [
        IncompatibleCategory::State,
        IncompatibleCategory::Program,
        IncompatibleCategory::Reply,
    ];

    /// The category's name as reported on the wire and in metrics (`state`, `program`, `reply`).
    pub fn as_str(self) -> &'static str {
        match self {
            IncompatibleCategory::State => "state",
            IncompatibleCategory::Program => "program",
            IncompatibleCategory::Reply => "reply",
        }
    }
}

/// The honest result of a rate evaluation: of one limit ([`RateLimitOutcome`], `T` =
/// [`RateLimitDecision`]) or of several at once ([`MultiOutcome`](crate::MultiOutcome), `T` =
/// [`MultiDecision`](crate::MultiDecision)). Only `Evaluated` carries an allow or a deny; the
/// failures say what is known about the state, never an allow, and are the same for both,
/// so a failure moves between them unchanged ([`Self::decided`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The provider evaluated the request: an allow or a deny.
    Evaluated(T),
    /// Known: nothing was mutated (for any limit).
    Unavailable {
        /// The policy that could not be evaluated (of several: the limit the failure arose at,
        /// the first one when it is not known).
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense (for `Clock`: until the server clock
        /// is back at the state's last write).
        retry_after_ms: u64,
        /// Why nothing was tried.
        category: UnavailableCategory,
    },
    /// Sent, result unknown: the request may or may not have consumed quota (of several
    /// limits: every limit or none).
    Indeterminate {
        /// The policy whose evaluation may or may not have happened (as for `Unavailable`).
        policy_id: PolicyId,
        /// Milliseconds after which trying again makes sense.
        retry_after_ms: u64,
    },
    /// State, program or reply mismatch. A refused state or program charged nothing; a reply
    /// that could not be read came after the program ran, so what it charged is unknown.
    Incompatible {
        /// The policy whose state, program or reply did not fit (as for `Unavailable`).
        policy_id: PolicyId,
        /// What did not fit.
        category: IncompatibleCategory,
    },
}

/// The honest result of an evaluation of one limit.
pub type RateLimitOutcome = Outcome<RateLimitDecision>;

impl<T> Outcome<T> {
    /// The [`Self::error_category`] of an [`Outcome::Indeterminate`] outcome.
    pub const INDETERMINATE_CATEGORY: &'static str = "indeterminate";

    /// Every name [`Self::error_category`] can return, each once: the unavailable
    /// categories, [`Self::INDETERMINATE_CATEGORY`], then the incompatible categories. A
    /// metric built from these has a series for a category added later without being told.
    pub fn error_categories() -> impl Iterator<Item = &'static str> {
        let unavailable = UnavailableCategory::ALL
            .into_iter()
            .map(UnavailableCategory::as_str);
        let incompatible = IncompatibleCategory::ALL
            .into_iter()
            .map(IncompatibleCategory::as_str);
        unavailable
            .chain([Self::INDETERMINATE_CATEGORY])
            .chain(incompatible)
    }

    /// The decision, when there is one.
    pub fn decision(&self) -> Option<&T> {
        match self {
            Outcome::Evaluated(d) => Some(d),
            _ => None,
        }
    }

    /// The outcome's name as reported on the wire and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Evaluated(_) => "evaluated",
            Outcome::Unavailable { .. } => "unavailable",
            Outcome::Indeterminate { .. } => "indeterminate",
            Outcome::Incompatible { .. } => "incompatible",
        }
    }

    /// Why no decision was made, as the `category` of the provider-error metric: the
    /// unavailable or incompatible category, or `indeterminate`; `None` for a decision.
    pub fn error_category(&self) -> Option<&'static str> {
        match self {
            Outcome::Evaluated(_) => None,
            Outcome::Unavailable { category, .. } => Some(category.as_str()),
            Outcome::Indeterminate { .. } => Some(Self::INDETERMINATE_CATEGORY),
            Outcome::Incompatible { category, .. } => Some(category.as_str()),
        }
    }

    /// The decision, or the failure as an outcome of another decision type (one limit's
    /// failure as a multi-limit outcome, or the reverse), unchanged.
    ///
    /// # Errors
    /// The failure, when this is not a decision.
    pub fn decided<U>(self) -> Result<T, Outcome<U>> {
        match self {
            Outcome::Evaluated(d) => Ok(d),
            Outcome::Unavailable {
                policy_id,
                retry_after_ms,
                category,
            } => Err(Outcome::Unavailable {
                policy_id,
                retry_after_ms,
                category,
            }),
            Outcome::Indeterminate {
                policy_id,
                retry_after_ms,
            } => Err(Outcome::Indeterminate {
                policy_id,
                retry_after_ms,
            }),
            Outcome::Incompatible {
                policy_id,
                category,
            } => Err(Outcome::Incompatible {
                policy_id,
                category,
            }),
        }
    }

    /// The decision mapped by `f`; a failure unchanged.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        self.decided()
            .map_or_else(|failure| failure, |d| Outcome::Evaluated(f(d)))
    }

    /// The same outcome with a failure reported for `policy_id` (a decision is unchanged:
    /// it names its own policy).
    #[must_use]
    pub fn failed_at(self, policy_id: PolicyId) -> Self {
        match self {
            Outcome::Unavailable {
                retry_after_ms,
                category,
                ..
            } => Outcome::Unavailable {
                policy_id,
                retry_after_ms,
                category,
            },
            Outcome::Indeterminate { retry_after_ms, .. } => Outcome::Indeterminate {
                policy_id,
                retry_after_ms,
            },
            Outcome::Incompatible { category, .. } => Outcome::Incompatible {
                policy_id,
                category,
            },
            evaluated @ Outcome::Evaluated(_) => evaluated,
        }
    }
}

impl RateLimitOutcome {
    /// The policy this outcome is for, whichever the variant.
    pub fn policy_id(&self) -> &PolicyId {
        match self {
            Outcome::Evaluated(d) => &d.policy_id,
            Outcome::Unavailable { policy_id, .. }
            | Outcome::Indeterminate { policy_id, .. }
            | Outcome::Incompatible { policy_id, .. } => policy_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variants of `$enum` listed after it, as an array, once a `match` on exactly those
    /// variants has compiled: a variant added to the enum and not listed here stops the test
    /// from compiling, so a list checked against it cannot silently fall behind.
    macro_rules! every_variant {
        ($enum:ident: $($variant:ident),+ $(,)?) => {{
            fn _listed(value: $enum) {
                match value {
                    $($enum::$variant)|+ => {}
                }
            }
            [$($enum::$variant),+]
        }};
    }

    #[test]
    fn all_holds_every_unavailable_category_once_in_order() {
        let every = every_variant!(UnavailableCategory: Connect, Admission, Deadline, Clock, CircuitOpen, Server);
        assert_eq!(UnavailableCategory::ALL, every);
    }

    #[test]
    fn all_holds_every_incompatible_category_once_in_order() {
        let every = every_variant!(IncompatibleCategory: State, Program, Reply);
        assert_eq!(IncompatibleCategory::ALL, every);
    }

    #[test]
    fn error_categories_name_every_category_an_outcome_reports_once() {
        let names: Vec<&str> = RateLimitOutcome::error_categories().collect();
        let policy_id = PolicyId::new("api").expect("valid id");
        let mut outcomes: Vec<RateLimitOutcome> = UnavailableCategory::ALL
            .into_iter()
            .map(|category| RateLimitOutcome::Unavailable {
                policy_id: policy_id.clone(),
                retry_after_ms: 0,
                category,
            })
            .collect();
        outcomes.push(RateLimitOutcome::Indeterminate {
            policy_id: policy_id.clone(),
            retry_after_ms: 0,
        });
        outcomes.extend(IncompatibleCategory::ALL.into_iter().map(|category| {
            RateLimitOutcome::Incompatible {
                policy_id: policy_id.clone(),
                category,
            }
        }));
        let reported: Vec<&str> = outcomes
            .iter()
            .map(|o| o.error_category().expect("not a decision"))
            .collect();
        assert_eq!(names, reported);
        let mut distinct = names.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }

    #[test]
    fn a_failure_moves_between_outcome_types_unchanged_and_can_name_another_policy() {
        let api = PolicyId::new("api").expect("valid id");
        let other = PolicyId::new("other").expect("valid id");
        let failure: RateLimitOutcome = Outcome::Unavailable {
            policy_id: api.clone(),
            retry_after_ms: 7,
            category: UnavailableCategory::Server,
        };
        let moved: Outcome<()> = failure.clone().decided::<()>().expect_err("a failure");
        assert_eq!(moved.error_category(), failure.error_category());
        assert_eq!(
            moved.failed_at(other.clone()),
            Outcome::Unavailable {
                policy_id: other.clone(),
                retry_after_ms: 7,
                category: UnavailableCategory::Server,
            }
        );
        let indeterminate: Outcome<u8> = Outcome::Indeterminate {
            policy_id: api,
            retry_after_ms: 3,
        };
        assert_eq!(
            indeterminate.failed_at(other.clone()).map(u16::from),
            Outcome::Indeterminate {
                policy_id: other.clone(),
                retry_after_ms: 3,
            }
        );
        // A decision names its own policy: `failed_at` leaves it, `map` maps it.
        let decided: Outcome<u8> = Outcome::Evaluated(4);
        assert_eq!(decided.clone().failed_at(other), decided);
        assert_eq!(decided.map(|n| u16::from(n) * 2), Outcome::Evaluated(8));
    }
}
