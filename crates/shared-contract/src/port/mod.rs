//! The port every provider implements, and the requests it takes: one policy's here, several
//! limits decided as one in [`multi`] (a child, because the port's `evaluate_all` takes its
//! request).

use std::collections::BTreeMap;

use crate::decision::RateLimitOutcome;
use crate::ids::{Cost, Deadline, EvaluationId, PolicyId, SubjectDigest};
use crate::lease::{AcquireOutcome, AcquireRequest, ReleaseOutcome, ReleaseRequest};
use crate::policy::{Algorithm, ConcurrencyParams, RateLimitPolicy};

pub mod multi;
pub mod reservations;

use multi::{MultiOutcome, MultiRequest};
use reservations::{
    CancelOutcome, CancelRequest, ChargeOutcome, ChargeRequest, ReserveOutcome, ReserveRequest,
    SettleOutcome, SettleRequest,
};

/// One request to evaluate against one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitRequest {
    /// The policy to evaluate against.
    pub policy_id: PolicyId,
    /// Whom the request counts for.
    pub subject: SubjectDigest,
    /// What the request consumes; at most the policy's `max_cost`.
    pub cost: Cost,
    /// Only for providers that deduplicate retried evaluations; others refuse it.
    pub evaluation_id: Option<EvaluationId>,
    /// When the caller needs the answer by.
    pub deadline: Deadline,
}

/// A request that no provider may evaluate. Nothing was consumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No policy of this id is configured.
    #[error("unknown policy {0}")]
    UnknownPolicy(PolicyId),
    /// The request costs more than the policy admits at once.
    #[error("cost {cost} is above max_cost {max_cost} of policy {policy_id}")]
    CostAboveMax {
        /// The policy whose `max_cost` was exceeded.
        policy_id: PolicyId,
        /// The request's cost.
        cost: u64,
        /// The policy's `max_cost`.
        max_cost: u64,
    },
    /// The request carries an evaluation id, and this provider does not deduplicate.
    #[error("this provider does not deduplicate evaluations; evaluation_id must be absent")]
    EvaluationIdUnsupported,
    /// A multi-limit evaluation with no limit.
    #[error("a multi-limit evaluation needs at least one limit")]
    NoLimits,
    /// A multi-limit evaluation with more than [`MAX_LIMITS`](crate::MAX_LIMITS) limits.
    #[error("a multi-limit evaluation takes at most {max} limits, got {got}")]
    TooManyLimits {
        /// How many limits the evaluation had.
        got: usize,
        /// The most accepted, [`MAX_LIMITS`](crate::MAX_LIMITS).
        max: usize,
    },
    /// The same policy appears twice for one subject in a multi-limit evaluation.
    #[error("policy {policy_id} is given twice for the same subject")]
    DuplicateLimit {
        /// The policy given twice.
        policy_id: PolicyId,
    },
    /// A cluster runs one program on the keys of one slot only: limits of different subjects
    /// live in different slots and cannot be decided atomically there.
    #[error(
        "the limits span {slots} cluster slots (different subjects); a multi-limit evaluation on a cluster takes one subject"
    )]
    SpansSlots {
        /// How many cluster slots the limits' keys fall in (at least 2).
        slots: usize,
    },
    /// The provider holds as many live evaluation ids as it may; a new one cannot be
    /// remembered, so it is refused rather than risk charging a retry twice.
    #[error("too many evaluation ids are held ({held}); retry later or send none")]
    EvaluationIdsFull {
        /// How many live evaluation ids the provider holds.
        held: usize,
    },
    /// `evaluate` or `evaluate_all` named a concurrency policy: its places are taken by
    /// acquiring a lease, never charged per request. Nothing was charged.
    #[error("policy {policy_id} is a concurrency policy; acquire a lease instead of evaluating")]
    ConcurrencyPolicy {
        /// The concurrency policy named.
        policy_id: PolicyId,
    },
    /// A lease was asked of (or released to) a rate policy.
    #[error("policy {policy_id} is not a concurrency policy; it has no leases")]
    NotConcurrencyPolicy {
        /// The rate policy named.
        policy_id: PolicyId,
    },
    /// A lease was asked of a provider that holds none.
    #[error("this provider does not hold leases")]
    LeasesUnsupported,
    /// A reservation was asked of a provider that keeps none.
    #[error("this provider does not keep reservations")]
    ReservationsUnsupported,
    /// A reservation named a policy whose algorithm takes none (sliding log, concurrency).
    #[error("policy {policy_id} is a {algorithm} policy; it takes no reservations")]
    ReservationUnsupported {
        /// The policy.
        policy_id: PolicyId,
        /// Its algorithm's configuration name.
        algorithm: &'static str,
    },
    /// A charge after the work was asked of a provider that takes none.
    #[error("this provider does not take charges after the work")]
    ChargesUnsupported,
    /// A new reservation while the provider holds as many as it may.
    #[error("too many reservations are held ({held}); settle or cancel some, or retry later")]
    ReservationsFull {
        /// Reservations held.
        held: usize,
    },
}

/// Whether a provider can evaluate now, and if not, why (for readiness probes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The provider can evaluate.
    Ready,
    /// The provider cannot evaluate now; carries the reason, for people.
    NotReady(String),
}

/// The edge-enforcement port: "may this request go through?".
///
/// Object safe and used as `Arc<dyn EdgeRateLimitPort>`; the provider is chosen at run time.
/// Implementations never panic and never answer an allow they do not know to be one.
#[async_trait::async_trait]
pub trait EdgeRateLimitPort: Send + Sync + std::fmt::Debug {
    /// Evaluates one request.
    ///
    /// # Errors
    /// [`RequestError`] when the request itself is unacceptable (unknown policy, cost above the
    /// policy's `max_cost`, an evaluation id this provider cannot honour); nothing is consumed.
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError>;

    /// Evaluates several limits of one caller request as one: allowed only when every limit
    /// admits, and then every limit is charged; when any limit denies, nothing is charged.
    /// With an evaluation id, a retry of the same limits within the replay window answers the
    /// first decision (`replayed`) and charges nothing more.
    ///
    /// # Errors
    /// [`RequestError`] when any limit is unacceptable, or the limits cannot be decided
    /// atomically by this provider; nothing is consumed.
    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError>;

    /// The policies this provider enforces.
    fn policies(&self) -> &PolicySet;

    /// Acquires one lease of a concurrency policy: held until released or until its expiry
    /// on the provider's clock, whichever comes first.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`], [`RequestError::NotConcurrencyPolicy`], or
    /// [`RequestError::LeasesUnsupported`] (the default); nothing is acquired.
    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        let _ = request;
        Err(RequestError::LeasesUnsupported)
    }

    /// Releases the lease `request` names, and no other.
    ///
    /// # Errors
    /// As [`Self::acquire_lease`], for the lease id's policy; nothing is released.
    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        let _ = request;
        Err(RequestError::LeasesUnsupported)
    }

    /// Reserves each limit's cost as an estimate, all or nothing (see
    /// [`crate::model::reserve`]): admitted, it answers a reservation id to settle or cancel.
    ///
    /// # Errors
    /// As [`Self::evaluate_all`], [`RequestError::ReservationUnsupported`] for a sliding-log
    /// policy, [`RequestError::ReservationsFull`], or [`RequestError::ReservationsUnsupported`]
    /// (the default); nothing is reserved.
    async fn reserve(&self, request: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        let _ = request;
        Err(RequestError::ReservationsUnsupported)
    }

    /// Settles a reservation with the actual costs; a retry answers the first settlement.
    ///
    /// # Errors
    /// [`RequestError::ReservationsUnsupported`] (the default). What the reservation's life
    /// refuses (unknown, expired, cancelled, a bad actual) is an answer, not an error.
    async fn settle(&self, request: SettleRequest) -> Result<SettleOutcome, RequestError> {
        let _ = request;
        Err(RequestError::ReservationsUnsupported)
    }

    /// Cancels a reservation, refunding its estimates; a retry answers as the first.
    ///
    /// # Errors
    /// As [`Self::settle`].
    async fn cancel(&self, request: CancelRequest) -> Result<CancelOutcome, RequestError> {
        let _ = request;
        Err(RequestError::ReservationsUnsupported)
    }

    /// Checks (cost 0) and charges (cost above 0, past the limit if need be) after the work,
    /// per limit: see [`ChargeRequest`]. Charges of one request are written together; a
    /// clock unsafe for any of them writes none.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`], [`RequestError::CostAboveMax`],
    /// [`RequestError::ReservationUnsupported`] (a sliding log or concurrency policy),
    /// [`RequestError::NoLimits`], [`RequestError::TooManyLimits`],
    /// [`RequestError::DuplicateLimit`], or [`RequestError::ChargesUnsupported`] (the default);
    /// nothing is charged.
    async fn charge(&self, request: ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        let _ = request;
        Err(RequestError::ChargesUnsupported)
    }

    /// Whether the provider can evaluate now.
    async fn readiness(&self) -> Readiness {
        Readiness::Ready
    }
}

/// Why a set of policies was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicySetError {
    /// Two policies have this id.
    #[error("policy {0} is defined twice")]
    Duplicate(PolicyId),
    /// The default policy id names no policy of the set.
    #[error("default policy {0} is not defined")]
    MissingDefault(PolicyId),
}

/// The policies of one provider, with the default one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySet {
    policies: BTreeMap<PolicyId, RateLimitPolicy>,
    default: PolicyId,
}

impl PolicySet {
    /// # Errors
    /// [`PolicySetError`] on a duplicate id or a default that is not among `policies`.
    pub fn new(
        policies: impl IntoIterator<Item = RateLimitPolicy>,
        default: PolicyId,
    ) -> Result<Self, PolicySetError> {
        let mut map = BTreeMap::new();
        for p in policies {
            if let Some(dup) = map.insert(p.id().clone(), p) {
                return Err(PolicySetError::Duplicate(dup.id().clone()));
            }
        }
        if !map.contains_key(&default) {
            return Err(PolicySetError::MissingDefault(default));
        }
        Ok(Self {
            policies: map,
            default,
        })
    }

    /// The policy of this id; `None` when there is none.
    pub fn get(&self, id: &PolicyId) -> Option<&RateLimitPolicy> {
        self.policies.get(id)
    }

    /// The policy used when a caller names none.
    pub fn default_id(&self) -> &PolicyId {
        &self.default
    }

    /// Every policy, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &RateLimitPolicy> {
        self.policies.values()
    }

    /// The policy of `request`, after the checks every provider makes before touching state.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`], [`RequestError::ConcurrencyPolicy`] or
    /// [`RequestError::CostAboveMax`].
    pub fn admit(&self, request: &RateLimitRequest) -> Result<&RateLimitPolicy, RequestError> {
        self.admit_cost(&request.policy_id, request.cost)
    }

    /// The concurrency policy `policy_id` names, and its parameters, after the checks every
    /// provider makes before acquiring or releasing a lease.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`] or [`RequestError::NotConcurrencyPolicy`].
    pub fn admit_lease(
        &self,
        policy_id: &PolicyId,
    ) -> Result<(&RateLimitPolicy, ConcurrencyParams), RequestError> {
        let policy = self
            .get(policy_id)
            .ok_or_else(|| RequestError::UnknownPolicy(policy_id.clone()))?;
        match policy.algorithm() {
            Algorithm::Concurrency(p) => Ok((policy, *p)),
            _ => Err(RequestError::NotConcurrencyPolicy {
                policy_id: policy_id.clone(),
            }),
        }
    }

    /// The policy of each limit, in order, after the checks every provider makes before
    /// touching state.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`] or [`RequestError::CostAboveMax`] for the first limit
    /// that fails them; nothing is evaluated.
    pub fn admit_all(&self, request: &MultiRequest) -> Result<Vec<&RateLimitPolicy>, RequestError> {
        request
            .limits
            .iter()
            .map(|l| self.admit_cost(&l.policy_id, l.cost))
            .collect()
    }

    /// [`Self::admit`] of a policy id and a cost.
    /// The policies of a reservation's limits, each checked as by [`Self::admit_all`] and
    /// refused when its algorithm takes no reservations.
    ///
    /// # Errors
    /// As [`Self::admit_all`], and [`RequestError::ReservationUnsupported`].
    pub fn admit_reservation(
        &self,
        request: &ReserveRequest,
    ) -> Result<Vec<&RateLimitPolicy>, RequestError> {
        request
            .limits
            .iter()
            .map(|l| reservable(self.admit_cost(&l.policy_id, l.cost)?))
            .collect()
    }

    /// The policies of a charge's limits: known, taking reservations (not a sliding log or
    /// concurrency policy), a cost within `max_cost`, 1..=`MAX_LIMITS` of them, no policy and
    /// subject twice.
    ///
    /// # Errors
    /// The [`RequestError`] naming the first bad limit.
    pub fn admit_charge(
        &self,
        request: &ChargeRequest,
    ) -> Result<Vec<&RateLimitPolicy>, RequestError> {
        let limits = &request.limits;
        if limits.is_empty() {
            return Err(RequestError::NoLimits);
        }
        if limits.len() > multi::MAX_LIMITS {
            return Err(RequestError::TooManyLimits {
                got: limits.len(),
                max: multi::MAX_LIMITS,
            });
        }
        let mut policies = Vec::with_capacity(limits.len());
        for (i, l) in limits.iter().enumerate() {
            if limits[..i]
                .iter()
                .any(|e| e.policy_id == l.policy_id && e.subject == l.subject)
            {
                return Err(RequestError::DuplicateLimit {
                    policy_id: l.policy_id.clone(),
                });
            }
            let policy = self
                .get(&l.policy_id)
                .ok_or_else(|| RequestError::UnknownPolicy(l.policy_id.clone()))?;
            let policy = reservable(policy)?;
            if l.cost > policy.max_cost().get() {
                return Err(RequestError::CostAboveMax {
                    policy_id: l.policy_id.clone(),
                    cost: l.cost,
                    max_cost: policy.max_cost().get(),
                });
            }
            policies.push(policy);
        }
        Ok(policies)
    }

    pub(crate) fn admit_cost(
        &self,
        policy_id: &PolicyId,
        cost: Cost,
    ) -> Result<&RateLimitPolicy, RequestError> {
        let policy = self
            .get(policy_id)
            .ok_or_else(|| RequestError::UnknownPolicy(policy_id.clone()))?;
        policy.admit_cost(cost)?;
        Ok(policy)
    }
}

impl RateLimitPolicy {
    /// The checks [`PolicySet::admit`] makes once it has found this policy: for a provider
    /// that finds the policy its own way (the local provider keeps it beside its slot).
    ///
    /// # Errors
    /// [`RequestError::ConcurrencyPolicy`] or [`RequestError::CostAboveMax`].
    pub fn admit_cost(&self, cost: Cost) -> Result<(), RequestError> {
        if matches!(self.algorithm(), Algorithm::Concurrency(_)) {
            return Err(RequestError::ConcurrencyPolicy {
                policy_id: self.id().clone(),
            });
        }
        if cost > self.max_cost() {
            return Err(RequestError::CostAboveMax {
                policy_id: self.id().clone(),
                cost: cost.get(),
                max_cost: self.max_cost().get(),
            });
        }
        Ok(())
    }
}

/// `policy`, or the refusal of one whose algorithm takes no reservations.
fn reservable(policy: &RateLimitPolicy) -> Result<&RateLimitPolicy, RequestError> {
    let kind = policy.kind();
    if kind.takes_reservations() {
        Ok(policy)
    } else {
        Err(RequestError::ReservationUnsupported {
            policy_id: policy.id().clone(),
            algorithm: kind.as_str(),
        })
    }
}
