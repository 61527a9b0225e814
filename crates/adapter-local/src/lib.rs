//! The in-memory rate-limit provider: the reference semantics of `shared-contract`, run on
//! state held in this process.
//!
//! The key design decision: **this crate implements no algorithm.** Every decision is
//! [`shared_contract::model::evaluate`] applied to the key's stored state under a key-level
//! lock, so the local provider decides exactly like the reference models (and so like the
//! Redis programs that mirror them), and two concurrent evaluations of one key never both see
//! the same state.
//!
//! # Keys, expiry and eviction
//!
//! State is keyed by (policy id, policy revision, subject digest): each policy of the
//! provider's [`PolicySet`] gets its own slot, and a slot fixes id and revision, so a new
//! revision never reads an old revision's state. (In the map a key is the digest XOR a secret
//! random mask of its slot: 32 bytes, see `store::Key`.)
//!
//! An entry expires [`RateLimitPolicy::state_lifetime_ms`] (the algorithm's reset horizon plus
//! the policy's cleanup grace) plus `max_clock_regression` after its last write, by the
//! provider's own [`Clock`]. State that old decides exactly like no state, so **expiry never
//! changes a decision**; it only frees the slot. (The margin of `max_clock_regression`: a write
//! made while the clock is behind the stored time, within the tolerance, is computed at the
//! stored time, so that state matters up to that much longer.) Expired entries read as absent
//! at once; their memory is reclaimed lazily (reused first when a slot is needed, and swept a
//! few slots per insert), with no background thread.
//!
//! At most [`LocalSettings::max_keys`] keys are held, across all policies. When more subjects
//! are active, a new key takes the slot of an expired entry or else evicts one (CLOCK, second
//! chance: keys seen again since the hand last passed are kept, keys written once and never
//! seen again go first). **Eviction means forgetting**: an evicted key that comes back starts
//! from empty state, so it may be admitted up to a fresh quota again. Over-admission is bounded
//! by one quota per eviction of that key, and happens only when more than `max_keys` keys are
//! live at once; size `max_keys` above the number of subjects active within a state lifetime
//! to avoid it.
//!
//! # Why not moka
//!
//! moka was the design's first choice. Measured side by side (docs/performance.md), its only
//! per-key serialized read-modify-write, `and_compute_with`, reaches 0.06-0.19 of governor's
//! keyed throughput with a p99 of 31-72 µs, because every allow is a cache write replayed
//! through moka's maintenance queues. The sharded map of the `store` module (a lock per shard,
//! state inline, expiry by the injected clock, CLOCK eviction) is 7-15 times faster (level
//! with governor on 1,000,000 keys, 0.7-0.8 of it on one hot key; p99 0.2 µs on a hot key and
//! 0.8 µs on 1,000,000 keys), so it is used instead.
//!
//! # Sources and certainty
//!
//! [`LocalProvider::new`] reports `source = local` and the algorithm's own certainty
//! (`approximate_algorithm` for the sliding-window counter, `certain` otherwise: this process
//! is the whole state). [`LocalProvider::fallback`] is the per-instance stand-in for an
//! unavailable global provider: `source = local_fallback`, `certainty = approximate_fallback`
//! (N instances may admit up to N times the limit).
//!
//! # Concurrency leases
//!
//! A concurrency policy's leases are one more kind of key state
//! ([`shared_contract::model::concurrency`]), acquired and released under the key's lock
//! ([`LocalProvider::acquire_now`], [`LocalProvider::release_now`]); lease tokens come from
//! an injected [`TokenSource`].
//!
//! # Several limits, evaluation ids
//!
//! [`LocalProvider::evaluate_all_now`] decides several limits as one
//! ([`shared_contract::model::multi`]): the keys' shard locks are taken together, in shard
//! order, so no evaluation sees a request half charged. An evaluation with an
//! `evaluation_id` remembers its decision for the replay window
//! ([`shared_contract::multi::replay_window_ms`]); a retry with the same id and limits answers
//! it again (`replayed`) and charges nothing. At most [`MAX_REPLAYS`] ids are live; beyond, a
//! new id is refused ([`RequestError::EvaluationIdsFull`]).
//!
//! The provider does not read the request's
//! deadline either: it never waits and answers in well under a microsecond, and reading a
//! second clock on every call would cost about 15% of that (measured).
//!
//! # Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | `publisher` | yes | [`LocalGatePublisher`], the Tokio task that publishes the local gates' due events on time without traffic (adds `tokio` and `tracing`; without it the crate needs no runtime) |

mod charges;
mod compact;
pub mod gate;
mod leases;
mod replay;
mod reservations;
mod store;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use shared_contract::model::multi::{
    self as multi_model, Member, MemberError, MultiEvaluation, MultiVerdict,
};
use shared_contract::model::{self, AlgorithmState};
use shared_contract::multi::{Limits, replay_window_ms};
use shared_contract::{
    AcquireOutcome, AcquireRequest, RandomTokens, ReleaseOutcome, ReleaseRequest, TokenSource,
};
use shared_contract::{
    CancelOutcome, CancelRequest, ChargeOutcome, ChargeRequest, ReserveOutcome, ReserveRequest,
    SettleOutcome, SettleRequest,
};
use shared_contract::{
    Certainty, Clock, EdgeRateLimitPort, IncompatibleCategory, MultiOutcome, MultiRequest,
    PolicyError, PolicyErrors, PolicyId, PolicyRevision, PolicySet, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, RateLimitRequest, RequestError, Source, UnavailableCategory,
};

pub use replay::MAX_REPLAYS;
use replay::{ReplayKey, Replays};
pub use reservations::MAX_RESERVATIONS;
use reservations::Records;
use store::{Key, Mask, SeededFold, Store};

#[cfg(feature = "publisher")]
pub use gate::LocalGatePublisher;
pub use gate::{LocalGateProvider, LocalGateSettings};

/// Tunables of the local provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSettings {
    /// Most keys (policy, revision, subject) held at once, across all policies. Beyond it,
    /// keys are evicted and start fresh when they return (see the crate docs). 0 holds nothing:
    /// every request is decided on empty state.
    pub max_keys: u64,
}

impl LocalSettings {
    /// Checks the bounds a configuration must meet: at least one key. (The provider runs
    /// with 0, deciding every request on empty state, but that is never what an operator
    /// who writes it means.)
    ///
    /// # Errors
    /// [`PolicyErrors`] naming `max_keys` when it is 0.
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        if self.max_keys == 0 {
            return Err(PolicyErrors(vec![PolicyError {
                field: "max_keys",
                problem: "must be > 0, got 0".to_owned(),
            }]));
        }
        Ok(())
    }
}

impl Default for LocalSettings {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
        }
    }
}

/// The in-memory provider. See the crate docs.
pub struct LocalProvider {
    policies: PolicySet,
    /// Slot of each policy, beside the policy itself so that a decision finds both with one
    /// lookup; the hasher is the store's, cheaper than SipHash.
    slots: HashMap<PolicyId, Held, SeededFold>,
    /// Slot numbers handed out so far, shared with every provider made by
    /// [`Self::with_policies`] from this one, so a new revision never gets a used number.
    next_slot: Arc<AtomicU32>,
    clock: Arc<dyn Clock>,
    store: Arc<Store>,
    source: Source,
    /// `Some` overrides the algorithm's certainty (the fallback's `approximate_fallback`).
    certainty: Option<Certainty>,
    max_keys: u64,
    /// First decisions of evaluations with an id. Evaluations with an id run under this lock
    /// (check, evaluate, remember), so concurrent retries of one id charge once.
    replays: Arc<Mutex<Replays>>,
    /// Where lease and reservation tokens come from ([`RandomTokens`] unless a test fixes
    /// them).
    tokens: Arc<dyn TokenSource>,
    /// Reservations, shared with every provider reloaded from this one.
    reservations: Arc<Mutex<Records>>,
}

/// Where a policy's state lives in the store, and how long an entry of it is kept.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u32,
    /// The slot's key mask, made once here rather than per decision.
    mask: Mask,
    lifetime_ms: u64,
    revision: PolicyRevision,
}

/// A policy of the provider's set and its slot.
#[derive(Debug)]
struct Held {
    slot: Slot,
    policy: RateLimitPolicy,
}

impl fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalProvider")
            .field("policies", &self.slots.keys().collect::<Vec<_>>())
            .field("clock", &self.clock)
            .field("source", &self.source)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl LocalProvider {
    /// A provider of `policies` reading time from `clock`; decisions report `source = local`
    /// and the algorithm's certainty.
    pub fn new(policies: PolicySet, clock: Arc<dyn Clock>, settings: LocalSettings) -> Self {
        Self::build(policies, clock, settings, Source::Local, None)
    }

    /// Same as [`Self::new`], but decisions report `source = local_fallback` and
    /// `certainty = approximate_fallback`: the stand-in for an unavailable global provider.
    pub fn fallback(policies: PolicySet, clock: Arc<dyn Clock>, settings: LocalSettings) -> Self {
        Self::build(
            policies,
            clock,
            settings,
            Source::LocalFallback,
            Some(Certainty::ApproximateFallback),
        )
    }

    fn build(
        policies: PolicySet,
        clock: Arc<dyn Clock>,
        settings: LocalSettings,
        source: Source,
        certainty: Option<Certainty>,
    ) -> Self {
        let next_slot = Arc::new(AtomicU32::new(0));
        let none = HashMap::with_hasher(SeededFold::new());
        let slots = assign_slots(&policies, &none, &next_slot);
        Self {
            store: Arc::new(Store::new(settings.max_keys)),
            next_slot,
            policies,
            slots,
            clock,
            source,
            certainty,
            max_keys: settings.max_keys,
            replays: Arc::new(Mutex::new(Replays::default())),
            tokens: Arc::new(RandomTokens::default()),
            reservations: Arc::new(Mutex::new(Records::default())),
        }
    }

    /// A provider of `policies` over this one's store (a configuration reload): a policy whose
    /// id and revision this provider already enforces keeps its state; a new policy, or a new
    /// revision, starts from empty state in a slot of its own (the old revision's entries are
    /// never read again and expire). Both providers may run at once (requests in flight on
    /// the old one finish there); they decide a shared key under the same lock.
    ///
    /// The caller keeps the revision rule: a policy whose parameters change must change its
    /// revision, or its stored state would be read under parameters it was not written with.
    #[must_use]
    pub fn with_policies(&self, policies: PolicySet) -> Self {
        let slots = assign_slots(&policies, &self.slots, &self.next_slot);
        Self {
            store: self.store.clone(),
            next_slot: self.next_slot.clone(),
            policies,
            slots,
            clock: self.clock.clone(),
            source: self.source,
            certainty: self.certainty,
            max_keys: self.max_keys,
            replays: self.replays.clone(),
            tokens: self.tokens.clone(),
            reservations: self.reservations.clone(),
        }
    }

    /// The same provider, taking lease tokens from `tokens` (tests fix them this way).
    #[must_use]
    pub fn with_tokens(mut self, tokens: Arc<dyn TokenSource>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Evaluates one request now, without an executor: the same code the port runs (the port
    /// never waits, so its future completes on first poll).
    ///
    /// # Errors
    /// [`RequestError`] for an evaluation id, an unknown policy or a cost above `max_cost`;
    /// nothing is consumed.
    pub fn evaluate_now(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitOutcome, RequestError> {
        if request.evaluation_id.is_some() {
            let policy_id = request.policy_id.clone();
            return Ok(self
                .evaluate_all_now(&MultiRequest::single(request.clone()))?
                .into_single(&policy_id));
        }
        // The same checks, in the same order, as `PolicySet::admit`.
        let Some(Held { slot, policy }) = self.slots.get(&request.policy_id) else {
            return Err(RequestError::UnknownPolicy(request.policy_id.clone()));
        };
        policy.admit_cost(request.cost)?;
        let key = Key::new(&slot.mask, request.subject.as_bytes());
        let cost = request.cost;
        let lifetime_ms = slot.lifetime_ms;
        // The store reads the clock under the key's lock, so the evaluations of one key see
        // times in the order they are serialized.
        let evaluation =
            self.store.update(
                key,
                &*self.clock,
                lifetime_ms,
                |state, now_ms| match model::decide(policy, state, now_ms, cost) {
                    Ok(mut evaluation) => (evaluation.new_state.take(), Ok(evaluation)),
                    Err(e) => (None, Err(e)),
                },
            );
        Ok(match evaluation {
            Ok(evaluation) => self.outcome(policy, &evaluation),
            Err(_) => RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                category: IncompatibleCategory::State,
            },
        })
    }

    /// Evaluates several limits as one, now, without an executor (see
    /// [`EdgeRateLimitPort::evaluate_all`]): every key is read and written under its lock, all
    /// locks held together, so no other evaluation sees a half-charged request.
    ///
    /// # Errors
    /// [`RequestError`] for an unknown policy, a cost above `max_cost`, or a new evaluation id
    /// when [`MAX_REPLAYS`] are live; nothing is consumed.
    pub fn evaluate_all_now(&self, request: &MultiRequest) -> Result<MultiOutcome, RequestError> {
        let policies = self.policies.admit_all(request)?;
        let mut slots = Vec::with_capacity(policies.len());
        for p in &policies {
            // Every policy of the set got a slot at construction.
            let held = self
                .slots
                .get(p.id())
                .ok_or_else(|| RequestError::UnknownPolicy(p.id().clone()))?;
            slots.push(held.slot);
        }
        let Some(id) = &request.evaluation_id else {
            return Ok(self.decide_all(request, &policies, &slots));
        };
        let key = ReplayKey::new(id, request, slots.iter().map(|s| s.index));
        let mut replays = self.replays.lock();
        let now = self.clock.now_ms();
        if let Some(first) = replays.get(&key, now) {
            return Ok(MultiOutcome::Evaluated(first));
        }
        replays.reserve(now)?;
        let outcome = self.decide_all(request, &policies, &slots);
        if let MultiOutcome::Evaluated(decision) = &outcome {
            let window = replay_window_ms(policies.iter().copied());
            replays.insert(key, now.saturating_add(window), decision.clone());
        }
        Ok(outcome)
    }

    fn decide_all(
        &self,
        request: &MultiRequest,
        policies: &[&RateLimitPolicy],
        slots: &[Slot],
    ) -> MultiOutcome {
        let keys: Vec<(Key, u64)> = request
            .limits
            .iter()
            .zip(policies)
            .zip(slots)
            .map(|((l, p), slot)| {
                (
                    Key::new(&slot.mask, l.subject.as_bytes()),
                    entry_lifetime_ms(p),
                )
            })
            .collect();
        let evaluation = self
            .store
            .update_many(&keys, &*self.clock, |states, now_ms| {
                let members = members(policies, states, &request.limits);
                match multi_model::decide_all(&members, now_ms) {
                    Ok(mut e) => {
                        let writes = (e.verdict == MultiVerdict::Allowed).then(|| {
                            e.members
                                .iter_mut()
                                .filter_map(|m| m.new_state.take())
                                .map(|state| (state, 0))
                                .collect()
                        });
                        (writes, Ok(e))
                    }
                    Err(err) => (None, Err(err)),
                }
            });
        self.multi_outcome(policies, evaluation)
    }

    /// The outcome of a multi-limit evaluation of `policies` by the models.
    fn multi_outcome(
        &self,
        policies: &[&RateLimitPolicy],
        evaluation: Result<MultiEvaluation, MemberError>,
    ) -> MultiOutcome {
        match evaluation {
            Ok(e) => match e.decision(policies.iter().copied(), self.source) {
                Some(mut decision) => {
                    if let Some(certainty) = self.certainty {
                        for d in &mut decision.decisions {
                            d.certainty = certainty;
                        }
                    }
                    MultiOutcome::Evaluated(decision)
                }
                // The clock went back beyond a policy's tolerance: nothing was written.
                None => {
                    let index = match e.verdict {
                        MultiVerdict::ClockUnsafe { index } => index,
                        _ => 0,
                    };
                    MultiOutcome::Unavailable {
                        policy_id: policies[index].id().clone(),
                        retry_after_ms: e.members.get(index).map_or(0, |m| m.retry_after_ms),
                        category: UnavailableCategory::Clock,
                    }
                }
            },
            Err(err) => MultiOutcome::Incompatible {
                policy_id: policies[err.index].id().clone(),
                category: IncompatibleCategory::State,
            },
        }
    }

    fn outcome(
        &self,
        policy: &RateLimitPolicy,
        evaluation: &model::Evaluation<AlgorithmState>,
    ) -> RateLimitOutcome {
        match self.decided(policy, evaluation) {
            Some(decision) => RateLimitOutcome::Evaluated(decision),
            // The clock went back beyond the policy's tolerance: nothing was written.
            None => RateLimitOutcome::Unavailable {
                policy_id: policy.id().clone(),
                retry_after_ms: evaluation.retry_after_ms,
                category: UnavailableCategory::Clock,
            },
        }
    }

    /// The decision of `evaluation` as this provider reports it (its source, and the
    /// fallback's certainty); `None` for an unsafe clock.
    fn decided(
        &self,
        policy: &RateLimitPolicy,
        evaluation: &model::Evaluation<AlgorithmState>,
    ) -> Option<RateLimitDecision> {
        let mut d = evaluation.decision(policy, self.source)?;
        if let Some(certainty) = self.certainty {
            d.certainty = certainty;
        }
        Some(d)
    }

    /// Live keys held now, at most `max_keys`. Reclaims expired entries first, walking the
    /// whole map: for tests and diagnostics, not for the request path.
    pub fn stored_keys(&self) -> u64 {
        self.store.purge_and_count(self.clock.now_ms())
    }
}

/// The slot of each policy of `policies`: the one of `previous` when it holds the same
/// revision, else a number never handed out before.
fn assign_slots(
    policies: &PolicySet,
    previous: &HashMap<PolicyId, Held, SeededFold>,
    next_slot: &AtomicU32,
) -> HashMap<PolicyId, Held, SeededFold> {
    let mut slots = HashMap::with_hasher(SeededFold::new());
    for policy in policies.iter() {
        let index = match previous.get(policy.id()) {
            Some(old) if old.slot.revision == policy.revision() => old.slot.index,
            _ => next_slot.fetch_add(1, Ordering::Relaxed),
        };
        let slot = Slot {
            index,
            mask: Mask::of(index),
            lifetime_ms: entry_lifetime_ms(policy),
            revision: policy.revision(),
        };
        let held = Held {
            slot,
            policy: policy.clone(),
        };
        slots.insert(policy.id().clone(), held);
    }
    slots
}

/// The model's members for `limits` of `policies`, with the keys' live `states`.
fn members<'a>(
    policies: &[&'a RateLimitPolicy],
    states: &[Option<&'a AlgorithmState>],
    limits: &Limits,
) -> Vec<Member<'a>> {
    policies
        .iter()
        .zip(states)
        .zip(limits.iter())
        .map(|((policy, state), l)| Member {
            policy,
            state: *state,
            cost: l.cost,
        })
        .collect()
}

/// How long an entry of `policy` is kept after its last write. See the crate docs.
fn entry_lifetime_ms(policy: &RateLimitPolicy) -> u64 {
    policy
        .state_lifetime_ms()
        .saturating_add(policy.max_clock_regression_ms())
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for LocalProvider {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        self.evaluate_now(&request)
    }

    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        self.evaluate_all_now(&request)
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        self.acquire_now(&request)
    }

    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        self.release_now(&request)
    }

    async fn reserve(&self, request: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        self.reserve_now(&request)
    }

    async fn settle(&self, request: SettleRequest) -> Result<SettleOutcome, RequestError> {
        self.settle_now(&request)
    }

    async fn cancel(&self, request: CancelRequest) -> Result<CancelOutcome, RequestError> {
        self.cancel_now(&request)
    }

    async fn charge(&self, request: ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        self.charge_now(&request)
    }

    fn policies(&self) -> &PolicySet {
        &self.policies
    }
}

#[cfg(test)]
mod tests;
