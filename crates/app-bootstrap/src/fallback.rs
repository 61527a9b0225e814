//! `fallback_local`: when the global provider cannot decide, a per-instance local limiter
//! does, and says so (`source = local_fallback`, `certainty = approximate_fallback`).
//!
//! ## The fleet share
//!
//! Each instance decides alone, so a fleet of `n` instances each admitting the whole limit
//! would admit `n` times it. Instead each admits its share: the policy with every amount
//! divided by the fleet's size ([`RateLimitPolicy::fleet_share`]: rounded down, so the fleet
//! admits at most the limit, and at least `limit - (n - 1)` of a window's limit). The size is
//! the last count the Redis heartbeat saw ([`FleetSize`]); it is frozen while Redis is
//! unreachable, which is when the fallback decides. An instance that never saw a count
//! (started during the outage) uses `size_when_unknown` (default 1: the whole limit, as if
//! alone; set it to the fleet's usual size for the bound to hold for such instances too).
//! A share that rounds to 0 (a limit smaller than the fleet) denies every request; so does a
//! cost above the share. In an evaluation of several limits such a member denies the whole
//! evaluation without evaluating the others, so every member then reports a denial at its
//! share (`remaining` = the share: nothing was charged).
//!
//! The shares' state lives in a store of its own per fleet size: when the size changes (only
//! a heartbeat that reached Redis changes it) the next outage starts from empty state. A
//! reload keeps the store (a policy of the same id and revision keeps its state).
//!
//! ## Starting from the last answer
//!
//! Each decision of the global provider for a policy that falls back locally is recorded
//! ([`crate::sightings`]: its `remaining`, and when it came). When the fallback first decides
//! for that key, it charges the key's share down to `remaining / size` of that answer, as of
//! when it came (the model's [`shared_contract::model::reserve::charge_spent`]: a window's
//! charge belongs to that answer's window, a bucket refills from then), and forgets the
//! answer. So each instance admits at most `remaining_i / size` more in that window, and the
//! fleet at most `sum(remaining_i) / size`: at most what Redis left when every instance's last
//! answer is recent (each `remaining_i` is what was left at the outage plus what the others
//! were admitted after it), where the plain shares would admit the whole limit again. A
//! key never answered for (or whose slot another key's answer took) starts from its plain
//! share. A sliding log holds no overdraft: its start is an entry of what fits (the log's
//! window from the answer's time). Charges add up: a second outage in the same window starts
//! from the first one's state and the new answer together, so it admits less, never more.
//!
//! Applies to `Unavailable`, `Indeterminate` and `Incompatible` outcomes alike: each means
//! "no global answer", and the fallback's answer never claims to be one. The provider's own
//! outcome is counted (`rate_limit_fallback_total{reason}`) so operators see why, and the
//! share in force is a gauge (`rate_limit_fallback_share{policy}`).
//!
//! Leases are never taken locally: a lease held in one instance's memory could not be
//! released through another, and its place would count on that instance alone. Acquire and
//! release go to the global provider, and a concurrency policy's failure is handled at the
//! edge like `fail_closed` (or `fail_open` when the policy says so).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adapter_local::{LocalProvider, LocalSettings};
use shared_contract::{
    AcquireOutcome, AcquireRequest, CancelOutcome, CancelRequest, Certainty, ChargeOutcome,
    ChargeRequest, Clock, Deadline, EdgeRateLimitPort, FailurePolicy, FleetShare, MultiDecision,
    MultiOutcome, MultiRequest, Outcome, PolicyId, PolicySet, RateLimitDecision, RateLimitOutcome,
    RateLimitPolicy, RateLimitRequest, Readiness, ReleaseOutcome, ReleaseRequest, RequestError,
    ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest, Source, SubjectDigest,
};

use crate::sightings::{Sighting, Sightings};

/// Where the fleet's size comes from (the Redis heartbeat's last count).
pub trait FleetSize: fmt::Debug + Send + Sync {
    /// The live instances last counted, this one included; `None` before the first count.
    fn size(&self) -> Option<u64>;
}

#[cfg(feature = "redis")]
impl FleetSize for adapter_redis::fleet::FleetView {
    fn size(&self) -> Option<u64> {
        adapter_redis::fleet::FleetView::settled_size(self)
    }
}

/// The fallback's state (see the module docs): kept across reloads.
#[derive(Debug)]
pub struct FallbackStore {
    policies: PolicySet,
    clock: Arc<dyn Clock>,
    settings: LocalSettings,
    fleet: Option<Arc<dyn FleetSize>>,
    size_when_unknown: u64,
    /// The shares of the fleet size last used, with their store.
    current: Mutex<Option<Arc<Shares>>>,
    /// What the global provider last answered for each key (kept across reloads).
    sightings: Arc<Sightings>,
}

/// The shares of every policy for one fleet size, over a store of their own.
#[derive(Debug)]
struct Shares {
    size: u64,
    provider: LocalProvider,
    /// Policies whose share rounds to 0: every request of theirs is denied. (Their place in
    /// `provider` holds the whole policy, never used, so the set keeps its default.)
    zero: BTreeSet<PolicyId>,
}

impl Shares {
    /// The shares of `store`'s policies for `size`, over a new store, or over `previous`'s
    /// (a reload: a policy of the same id and revision keeps its state).
    fn new(store: &FallbackStore, size: u64, previous: Option<&LocalProvider>) -> Self {
        let mut zero = BTreeSet::new();
        let shares: Vec<RateLimitPolicy> = store
            .policies
            .iter()
            .map(|p| {
                p.fleet_share(size).unwrap_or_else(|| {
                    zero.insert(p.id().clone());
                    p.clone()
                })
            })
            .collect();
        let set = PolicySet::new(shares, store.policies.default_id().clone())
            .expect("the same ids and default as a valid set");
        for p in set.iter() {
            let share = if zero.contains(p.id()) {
                0
            } else {
                p.algorithm().limit()
            };
            metrics::gauge!("rate_limit_fallback_share", "policy" => p.id().to_string())
                .set(share as f64);
        }
        let provider = match previous {
            Some(p) => p.with_policies(set),
            None => LocalProvider::fallback(set, store.clock.clone(), store.settings),
        };
        Self {
            size,
            provider,
            zero,
        }
    }

    /// This size's share of `policy` when it admits `cost` at all; `None` when the share is 0
    /// or smaller than the cost.
    fn admits(&self, policy: &PolicyId, cost: u64) -> Option<&RateLimitPolicy> {
        if self.zero.contains(policy) {
            return None;
        }
        self.provider
            .policies()
            .get(policy)
            .filter(|p| p.max_cost().get() >= cost)
    }

    fn tag(&self, d: &mut RateLimitDecision) {
        d.fleet = Some(FleetShare {
            share: d.limit,
            size: self.size,
        });
    }

    /// The denial of a request no share of this size can admit: nothing is charged.
    fn refuse(
        &self,
        policy: &RateLimitPolicy,
        retry_after_ms: u64,
        now_ms: u64,
    ) -> RateLimitDecision {
        let share = self
            .admits(policy.id(), 1)
            .map_or(0, |p| p.algorithm().limit());
        RateLimitDecision {
            allowed: false,
            limit: share,
            remaining: share,
            retry_after_ms: retry_after_ms.max(1),
            reset_at_ms: now_ms.saturating_add(retry_after_ms),
            policy_id: policy.id().clone(),
            revision: policy.revision(),
            source: Source::LocalFallback,
            certainty: Certainty::ApproximateFallback,
            fleet: Some(FleetShare {
                share,
                size: self.size,
            }),
        }
    }
}

impl FallbackStore {
    /// The fallback of `policies` on `clock`, each instance admitting its share of a fleet of
    /// the size `fleet` last counted (`size_when_unknown` before any count, or without a
    /// fleet).
    pub fn new(
        policies: PolicySet,
        clock: Arc<dyn Clock>,
        settings: LocalSettings,
        fleet: Option<Arc<dyn FleetSize>>,
        size_when_unknown: u64,
    ) -> Self {
        Self {
            policies,
            clock,
            settings,
            fleet,
            size_when_unknown: size_when_unknown.max(1),
            current: Mutex::new(None),
            sightings: Arc::new(Sightings::new(
                usize::try_from(settings.max_keys).unwrap_or(usize::MAX),
            )),
        }
    }

    /// The same store for `policies` (a reload): a policy of the same id and revision keeps
    /// its shares' state.
    #[must_use]
    pub fn with_policies(&self, policies: PolicySet) -> Self {
        let next = Self {
            policies,
            clock: self.clock.clone(),
            settings: self.settings,
            fleet: self.fleet.clone(),
            size_when_unknown: self.size_when_unknown,
            current: Mutex::new(None),
            sightings: self.sightings.clone(),
        };
        let current = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(old) = current {
            let shares = Shares::new(&next, old.size, Some(&old.provider));
            *next.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(shares));
        }
        next
    }

    /// The fleet size in force: the last count, or `size_when_unknown`.
    pub fn size(&self) -> u64 {
        self.fleet
            .as_ref()
            .and_then(|f| f.size())
            .unwrap_or(self.size_when_unknown)
            .max(1)
    }

    /// The shares of the size in force; a new size gets a new, empty store.
    fn shares(&self) -> Arc<Shares> {
        let size = self.size();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match &*current {
            Some(s) if s.size == size => s.clone(),
            _ => {
                let shares = Arc::new(Shares::new(self, size, None));
                *current = Some(shares.clone());
                shares
            }
        }
    }

    /// Decides `request` with this instance's share.
    fn evaluate(
        &self,
        request: &RateLimitRequest,
        retry_after_ms: u64,
    ) -> Result<RateLimitOutcome, RequestError> {
        let shares = self.shares();
        if shares
            .admits(&request.policy_id, request.cost.get())
            .is_none()
        {
            let Some(policy) = self.policies.get(&request.policy_id) else {
                return Err(RequestError::UnknownPolicy(request.policy_id.clone()));
            };
            return Ok(RateLimitOutcome::Evaluated(shares.refuse(
                policy,
                retry_after_ms,
                self.clock.now_ms(),
            )));
        }
        self.start(&shares, &request.policy_id, &request.subject);
        let mut outcome = shares.provider.evaluate_now(request)?;
        if let RateLimitOutcome::Evaluated(d) = &mut outcome {
            shares.tag(d);
        }
        Ok(outcome)
    }

    /// Records the global provider's answer `d` for `subject`: the fallback starts from it
    /// when it first decides for the key.
    fn saw(&self, subject: SubjectDigest, d: &RateLimitDecision) {
        self.sightings.record(Sighting {
            policy: d.policy_id.clone(),
            revision: d.revision,
            subject,
            remaining: d.remaining,
            at_ms: self.clock.now_ms(),
        });
    }

    /// Starts the key's share from the global provider's last answer for it, once: charges
    /// the share down to `remaining / size` of that answer, as of when it came (see the
    /// module docs). A key never answered for, or answered for at another revision, starts
    /// from its share's own state.
    fn start(&self, shares: &Shares, policy: &PolicyId, subject: &SubjectDigest) {
        let Some(share) = shares.provider.policies().get(policy) else {
            return;
        };
        if shares.zero.contains(policy) {
            return;
        }
        // Under the sighting's slot: a request racing this one for the key waits for the
        // charge instead of deciding from the plain share.
        self.sightings.take_with(policy, subject, |seen| {
            if seen.revision == share.revision() {
                let limit = share.algorithm().limit();
                let left = (seen.remaining / shares.size).min(limit);
                shares
                    .provider
                    .charge_as_of(policy, subject, limit - left, seen.at_ms);
            }
        });
    }

    /// Decides `request` with this instance's shares, all or nothing.
    fn evaluate_all(
        &self,
        request: &MultiRequest,
        retry_after_ms: u64,
    ) -> Result<MultiOutcome, RequestError> {
        let shares = self.shares();
        let refused = request
            .limits
            .iter()
            .any(|l| shares.admits(&l.policy_id, l.cost.get()).is_none());
        if refused {
            let mut decisions = Vec::with_capacity(request.limits.len());
            for l in request.limits.iter() {
                let Some(policy) = self.policies.get(&l.policy_id) else {
                    return Err(RequestError::UnknownPolicy(l.policy_id.clone()));
                };
                decisions.push(shares.refuse(policy, retry_after_ms, self.clock.now_ms()));
            }
            return Ok(MultiOutcome::Evaluated(MultiDecision {
                allowed: false,
                decisions,
                replayed: false,
            }));
        }
        for l in request.limits.iter() {
            self.start(&shares, &l.policy_id, &l.subject);
        }
        let mut outcome = shares.provider.evaluate_all_now(request)?;
        if let MultiOutcome::Evaluated(d) = &mut outcome {
            for member in &mut d.decisions {
                shares.tag(member);
            }
        }
        Ok(outcome)
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct LocalFallback {
    inner: Arc<dyn EdgeRateLimitPort>,
    fallback: Arc<FallbackStore>,
}

impl LocalFallback {
    /// `inner` answered by `fallback` when it cannot decide.
    pub fn new(inner: Arc<dyn EdgeRateLimitPort>, fallback: Arc<FallbackStore>) -> Self {
        Self { inner, fallback }
    }
}

/// The retry hint of an outcome that is not a decision.
fn retry_after<T>(outcome: &Outcome<T>) -> u64 {
    match outcome {
        Outcome::Unavailable { retry_after_ms, .. }
        | Outcome::Indeterminate { retry_after_ms, .. } => *retry_after_ms,
        _ => 1_000,
    }
}

/// The `reason` label of a fallback: what the global provider answered instead of a decision.
fn reason<T>(outcome: &Outcome<T>) -> &'static str {
    match outcome {
        Outcome::Unavailable { category, .. } => category.as_str(),
        Outcome::Indeterminate { .. } => "indeterminate",
        Outcome::Incompatible { .. } => "incompatible",
        Outcome::Evaluated(_) => "evaluated",
    }
}

impl LocalFallback {
    /// Whether `policy` (its own failure policy, or the global one it inherited) asks for the
    /// local fallback.
    fn falls_back(&self, policy: &PolicyId) -> bool {
        self.inner
            .policies()
            .get(policy)
            .is_some_and(|p| p.failure_policy() == FailurePolicy::FallbackLocal)
    }
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for LocalFallback {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        // The request is kept for the fallback; cloning it is a few words plus the policy id.
        let outcome = self.inner.evaluate(request.clone()).await?;
        if !self.falls_back(&request.policy_id) {
            return Ok(outcome);
        }
        if let RateLimitOutcome::Evaluated(d) = &outcome {
            self.fallback.saw(request.subject, d);
            return Ok(outcome);
        }
        metrics::counter!("rate_limit_fallback_total", "reason" => reason(&outcome)).increment(1);
        tracing::debug!(
            policy = %request.policy_id,
            provider_outcome = reason(&outcome),
            "global provider gave no answer; deciding locally (local_fallback)"
        );
        // The global attempt may have used the caller's whole budget (a command timeout); the
        // local decision takes microseconds, so it gets a fresh one.
        let deadline = Deadline::within(Duration::from_secs(1)).unwrap_or(request.deadline);
        let request = RateLimitRequest {
            deadline,
            ..request
        };
        self.fallback.evaluate(&request, retry_after(&outcome))
    }

    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        let outcome = self.inner.evaluate_all(request.clone()).await?;
        if !request.limits.iter().all(|l| self.falls_back(&l.policy_id)) {
            // A policy of this evaluation does not ask for the fallback: its own failure
            // policy applies to the whole evaluation, at the edge.
            return Ok(outcome);
        }
        if let MultiOutcome::Evaluated(m) = &outcome {
            for (l, d) in request.limits.iter().zip(&m.decisions) {
                self.fallback.saw(l.subject, d);
            }
            return Ok(outcome);
        }
        let reason = reason(&outcome);
        metrics::counter!("rate_limit_fallback_total", "reason" => reason).increment(1);
        tracing::debug!(
            limits = request.limits.len(),
            provider_outcome = reason,
            "global provider gave no answer; deciding locally (local_fallback)"
        );
        let deadline = Deadline::within(Duration::from_secs(1)).unwrap_or(request.deadline);
        // An evaluation id is the global provider's to honour: the fallback decides afresh
        // (an `Indeterminate` global attempt may have charged; the fallback says it is
        // approximate anyway).
        let retry_after_ms = retry_after(&outcome);
        let request = MultiRequest {
            deadline,
            evaluation_id: None,
            ..request
        };
        self.fallback.evaluate_all(&request, retry_after_ms)
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        self.inner.acquire_lease(request).await
    }

    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        self.inner.release_lease(request).await
    }

    /// Reservations are the global provider's alone: a reservation the fallback held would
    /// be unknown to Redis when it answers again (and to every other instance). A failure
    /// is reported as it is; nothing is reserved then.
    async fn reserve(&self, request: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        self.inner.reserve(request).await
    }

    async fn settle(&self, request: SettleRequest) -> Result<SettleOutcome, RequestError> {
        self.inner.settle(request).await
    }

    async fn cancel(&self, request: CancelRequest) -> Result<CancelOutcome, RequestError> {
        self.inner.cancel(request).await
    }

    /// Charges after the work are the global provider's alone: a charge the fallback took
    /// would be forgotten when Redis answers again, and a check it answered could admit what
    /// Redis refuses. A failure is reported as it is (Envoy ignores the answer anyway).
    async fn charge(&self, request: ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        self.inner.charge(request).await
    }

    fn policies(&self) -> &PolicySet {
        self.inner.policies()
    }

    /// The global provider's readiness: the fallback keeps answering, but an operator must
    /// see that the global one does not.
    async fn readiness(&self) -> Readiness {
        self.inner.readiness().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use shared_contract::testing::ScriptedPort;
    use shared_contract::{Cost, Limit, Limits, ManualClock, SubjectDigest, UnavailableCategory};

    use super::*;

    /// A fleet whose count the test sets (0: not counted yet).
    #[derive(Debug, Default)]
    struct Counted(AtomicU64);

    impl FleetSize for Counted {
        fn size(&self) -> Option<u64> {
            Some(self.0.load(Ordering::Relaxed)).filter(|n| *n > 0)
        }
    }

    fn policies() -> PolicySet {
        let window = RateLimitPolicy::fixed_window("api", 10)
            .per(Duration::from_secs(3600))
            .max_cost(5)
            .failure_policy(FailurePolicy::FallbackLocal)
            .build()
            .expect("valid policy");
        let bucket = RateLimitPolicy::token_bucket("tokens", 2)
            .per(Duration::from_secs(3600))
            .failure_policy(FallbackLocal)
            .build()
            .expect("valid policy");
        let id = window.id().clone();
        PolicySet::new([window, bucket], id).expect("valid set")
    }
    use FailurePolicy::FallbackLocal;

    /// A fallback over a provider that is down, on a fleet the test counts.
    fn fallback(size_when_unknown: u64) -> (LocalFallback, Arc<Counted>) {
        let down = ScriptedPort::unavailable(policies(), UnavailableCategory::Connect, 250);
        over(Arc::new(down), size_when_unknown)
    }

    /// A fallback over `port`, on a fleet the test counts.
    fn over(port: Arc<ScriptedPort>, size_when_unknown: u64) -> (LocalFallback, Arc<Counted>) {
        let fleet = Arc::new(Counted::default());
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = FallbackStore::new(
            policies(),
            clock,
            LocalSettings::default(),
            Some(fleet.clone()),
            size_when_unknown,
        );
        (LocalFallback::new(port, Arc::new(store)), fleet)
    }

    fn request(policy: &str, subject: u8, cost: u64) -> RateLimitRequest {
        RateLimitRequest {
            policy_id: PolicyId::new(policy).expect("valid id"),
            subject: SubjectDigest::from_bytes([subject; 32]),
            cost: Cost::new(cost).expect("valid cost"),
            evaluation_id: None,
            deadline: Deadline::within(Duration::from_secs(1)).expect("valid budget"),
        }
    }

    async fn decide(f: &LocalFallback, r: RateLimitRequest) -> RateLimitDecision {
        match f.evaluate(r).await.expect("a valid request") {
            RateLimitOutcome::Evaluated(d) => d,
            other => panic!("expected a decision, got {other:?}"),
        }
    }

    /// Cost admitted by `n` requests of cost 1.
    async fn admitted(f: &LocalFallback, policy: &str, subject: u8, n: usize) -> u64 {
        let mut total = 0;
        for _ in 0..n {
            total += u64::from(decide(f, request(policy, subject, 1)).await.allowed);
        }
        total
    }

    #[tokio::test]
    async fn each_instance_admits_its_share_of_the_counted_fleet() {
        let (f, fleet) = fallback(1);
        fleet.0.store(3, Ordering::Relaxed);
        assert_eq!(admitted(&f, "api", 1, 20).await, 3, "10 / 3 rounded down");
        let d = decide(&f, request("api", 1, 1)).await;
        assert!(!d.allowed);
        assert_eq!(d.source, Source::LocalFallback);
        assert_eq!(d.limit, 3);
        assert_eq!(d.fleet, Some(FleetShare { share: 3, size: 3 }));
        // A new count is a new store: the next outage starts afresh at the new share.
        fleet.0.store(2, Ordering::Relaxed);
        assert_eq!(admitted(&f, "api", 1, 20).await, 5);
    }

    #[tokio::test]
    async fn a_reload_keeps_what_the_shares_admitted() {
        let (f, fleet) = fallback(1);
        fleet.0.store(3, Ordering::Relaxed);
        assert_eq!(admitted(&f, "api", 1, 20).await, 3);
        let down = ScriptedPort::unavailable(policies(), UnavailableCategory::Connect, 250);
        let reloaded = LocalFallback::new(
            Arc::new(down),
            Arc::new(f.fallback.with_policies(policies())),
        );
        assert_eq!(
            admitted(&reloaded, "api", 1, 20).await,
            0,
            "the share is spent"
        );
        assert_eq!(admitted(&reloaded, "api", 2, 20).await, 3);
    }

    #[tokio::test]
    async fn before_any_count_the_configured_size_applies() {
        let (f, _) = fallback(4);
        assert_eq!(admitted(&f, "api", 1, 20).await, 2, "10 / 4");
        let d = decide(&f, request("api", 1, 1)).await;
        assert_eq!(d.fleet, Some(FleetShare { share: 2, size: 4 }));
        let (alone, _) = fallback(1);
        assert_eq!(admitted(&alone, "api", 1, 20).await, 10);
    }

    #[tokio::test]
    async fn a_share_of_nothing_or_below_the_cost_denies_without_an_error() {
        let (f, fleet) = fallback(1);
        fleet.0.store(3, Ordering::Relaxed);
        // Token bucket of 2 over 3 instances: a share of 0.
        let d = decide(&f, request("tokens", 1, 1)).await;
        assert!(!d.allowed);
        assert_eq!(d.fleet, Some(FleetShare { share: 0, size: 3 }));
        assert_eq!(d.retry_after_ms, 250, "the provider's retry hint");
        // A cost of 5 is valid for the policy but above a share of 3: denied, not refused.
        let d = decide(&f, request("api", 2, 5)).await;
        assert!(!d.allowed);
        assert_eq!(d.fleet, Some(FleetShare { share: 3, size: 3 }));
        assert_eq!(
            admitted(&f, "api", 2, 20).await,
            3,
            "the denial charged nothing"
        );
    }

    #[tokio::test]
    async fn several_limits_are_shared_all_or_nothing() {
        let (f, fleet) = fallback(1);
        fleet.0.store(2, Ordering::Relaxed);
        let limits = |cost| {
            let limit = |policy: &str, cost| Limit {
                policy_id: PolicyId::new(policy).expect("valid id"),
                subject: SubjectDigest::from_bytes([7; 32]),
                cost: Cost::new(cost).expect("valid cost"),
            };
            MultiRequest {
                limits: Limits::new(vec![limit("api", cost), limit("tokens", 1)])
                    .expect("valid limits"),
                evaluation_id: None,
                deadline: Deadline::within(Duration::from_secs(1)).expect("valid budget"),
            }
        };
        let MultiOutcome::Evaluated(d) = f.evaluate_all(limits(1)).await.expect("valid") else {
            panic!("expected a decision")
        };
        assert!(d.allowed);
        let shares: Vec<_> = d.decisions.iter().map(|m| m.fleet).collect();
        let share = |share| Some(FleetShare { share, size: 2 });
        assert_eq!(shares, vec![share(5), share(1)]);
        // The bucket's share (1) is spent: the window is not charged either.
        let MultiOutcome::Evaluated(d) = f.evaluate_all(limits(1)).await.expect("valid") else {
            panic!("expected a decision")
        };
        assert!(!d.allowed);
        assert_eq!(admitted(&f, "api", 7, 20).await, 4, "5 - the first request");
    }

    /// A fallback over a provider the test takes down, answering `remaining(subject)` until
    /// then.
    fn seen_then_down(
        remaining: impl Fn(u8) -> u64 + Send + Sync + 'static,
    ) -> (LocalFallback, Arc<ScriptedPort>, Arc<Counted>) {
        let port = Arc::new(ScriptedPort::allowing_with(policies(), move |r| {
            remaining(r.subject.as_bytes()[0])
        }));
        let (f, fleet) = over(port.clone(), 1);
        (f, port, fleet)
    }

    fn down(port: &ScriptedPort) {
        port.script(|r| {
            Ok(RateLimitOutcome::Unavailable {
                policy_id: r.policy_id.clone(),
                retry_after_ms: 250,
                category: UnavailableCategory::Connect,
            })
        });
    }

    #[tokio::test]
    async fn the_share_starts_from_what_the_global_provider_last_left() {
        // 10 per hour over 3 instances: a share of 3. Redis last said 4 were left for
        // subject 1 and 9 for subject 2; subject 3 was never answered for.
        let (f, port, fleet) = seen_then_down(|subject| if subject == 1 { 4 } else { 9 });
        fleet.0.store(3, Ordering::Relaxed);
        assert!(decide(&f, request("api", 1, 1)).await.allowed);
        assert!(decide(&f, request("api", 2, 1)).await.allowed);
        down(&port);
        assert_eq!(admitted(&f, "api", 1, 20).await, 1, "4 / 3 rounded down");
        assert_eq!(
            admitted(&f, "api", 2, 20).await,
            3,
            "9 / 3, the whole share"
        );
        assert_eq!(admitted(&f, "api", 3, 20).await, 3, "never seen: the share");
        let d = decide(&f, request("api", 1, 1)).await;
        assert_eq!((d.allowed, d.remaining), (false, 0));
        assert_eq!(d.fleet, Some(FleetShare { share: 3, size: 3 }));
    }

    #[tokio::test]
    async fn a_spent_limit_stays_spent_and_a_bucket_starts_where_it_was_left() {
        let (f, port, _) = seen_then_down(|_| 0);
        // Alone (size 1): the share is the whole policy.
        assert!(decide(&f, request("api", 1, 1)).await.allowed);
        assert!(decide(&f, request("tokens", 1, 1)).await.allowed);
        down(&port);
        assert_eq!(admitted(&f, "api", 1, 20).await, 0, "nothing was left");
        assert_eq!(
            admitted(&f, "tokens", 1, 20).await,
            0,
            "the bucket was empty"
        );
        // The sighting is used once: a second outage keeps what the first one charged.
        assert_eq!(admitted(&f, "api", 1, 20).await, 0);
        let (f, port, _) = seen_then_down(|_| 1);
        assert!(decide(&f, request("tokens", 2, 1)).await.allowed);
        down(&port);
        assert_eq!(admitted(&f, "tokens", 2, 20).await, 1, "1 of 2 was left");
    }
}
