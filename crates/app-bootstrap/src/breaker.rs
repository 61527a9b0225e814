//! A circuit breaker around a provider: after `failure_threshold` consecutive unavailable or
//! indeterminate outcomes it stops sending for `cool_down`, answering
//! `Unavailable(circuit_open)` at once (nothing is sent, so nothing is mutated: the honest
//! category). Then one request is let through as a probe (half-open): an evaluated outcome
//! closes the circuit, a failure opens it for another cool-down.
//!
//! Why: when Redis is gone, every request otherwise waits for a connection error or a
//! command timeout; an open circuit answers in nanoseconds and takes load off a recovering
//! server. The state is a few atomics, so the closed path (the normal one) costs two loads.
//!
//! Time is the injected [`Clock`]'s, as for every time-based part (tests advance a
//! `ManualClock` instead of sleeping). Only the length of the cool-down is measured, so a
//! clock that goes back past the moment the circuit opened ends the cool-down at once (one
//! probe) rather than holding the circuit open for as long as the clock went back.
//!
//! Counted as failures: `Unavailable` of categories connect, server and clock, and
//! `Indeterminate`. Not counted: `admission` and `deadline` (this process's own load and its
//! callers' budgets say nothing about the server) and `Incompatible` (not transient; a breaker
//! would only hide it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use shared_contract::{
    AcquireOutcome, AcquireRequest, CancelOutcome, CancelRequest, ChargeOutcome, ChargeRequest,
    Clock, EdgeRateLimitPort, MultiOutcome, MultiRequest, Outcome, PolicySet, RateLimitOutcome,
    RateLimitRequest, Readiness, ReleaseOutcome, ReleaseRequest, RequestError, ReserveOutcome,
    ReserveRequest, SettleOutcome, SettleRequest, SystemClock, UnavailableCategory,
};

use crate::settings::BreakerSettings;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// The breaker's state, as metrics and logs show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests reach the provider; consecutive failures are counted.
    Closed,
    /// Requests are answered `Unavailable(circuit_open)` without reaching the provider until the
    /// cool-down ends.
    Open,
    /// The cool-down has ended: one probe is let through, and its outcome closes or reopens the
    /// circuit.
    HalfOpen,
}

impl BreakerState {
    /// The state's name in logs: `"closed"`, `"open"` or `"half_open"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `rate_limit_circuit_breaker_state` gauge.
    pub fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct CircuitBreaker {
    inner: Arc<dyn EdgeRateLimitPort>,
    /// Shared with the breakers [`Self::with_inner`] makes from this one.
    circuit: Arc<Circuit>,
}

/// The state of one circuit.
#[derive(Debug)]
struct Circuit {
    settings: BreakerSettings,
    state: AtomicU8,
    failures: AtomicU32,
    /// When an open circuit may probe, by `clock`.
    open_until_ms: AtomicU64,
    clock: Arc<dyn Clock>,
}

impl CircuitBreaker {
    /// A breaker around `inner` on the system clock.
    pub fn new(inner: Arc<dyn EdgeRateLimitPort>, settings: BreakerSettings) -> Self {
        Self::with_clock(inner, settings, Arc::new(SystemClock))
    }

    /// A breaker around `inner` that reads time from `clock`.
    pub fn with_clock(
        inner: Arc<dyn EdgeRateLimitPort>,
        settings: BreakerSettings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let b = Self {
            inner,
            circuit: Arc::new(Circuit {
                settings,
                state: AtomicU8::new(CLOSED),
                failures: AtomicU32::new(0),
                open_until_ms: AtomicU64::new(0),
                clock,
            }),
        };
        b.export(BreakerState::Closed);
        b
    }

    /// A breaker around `inner` on this breaker's circuit (a configuration reload puts the
    /// same connections behind a new policy set): an open circuit stays open.
    #[must_use]
    pub fn with_inner(&self, inner: Arc<dyn EdgeRateLimitPort>) -> Self {
        Self {
            inner,
            circuit: self.circuit.clone(),
        }
    }

    /// The circuit's current state (shared with the breakers [`Self::with_inner`] made).
    pub fn state(&self) -> BreakerState {
        match self.circuit.state.load(Ordering::Acquire) {
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    fn export(&self, state: BreakerState) {
        metrics::gauge!(edge_middleware::limiter::names::BREAKER_STATE).set(state.gauge());
    }

    fn transition(&self, to: BreakerState, why: &str) {
        self.export(to);
        metrics::counter!("rate_limit_circuit_breaker_transitions_total", "to" => to.as_str())
            .increment(1);
        match to {
            BreakerState::Open => tracing::warn!(
                state = to.as_str(),
                cool_down_ms = self.cool_down_ms(),
                "rate-limit circuit breaker opened: {why}"
            ),
            _ => tracing::info!(state = to.as_str(), "rate-limit circuit breaker: {why}"),
        }
    }

    fn now_ms(&self) -> u64 {
        self.circuit.clock.now_ms()
    }

    fn cool_down_ms(&self) -> u64 {
        self.circuit.settings.cool_down.as_millis() as u64
    }

    /// Whether an open circuit's cool-down is over at `now`: its deadline has passed, or the
    /// clock went back before the moment the circuit opened (see the module docs).
    fn cooled_down(&self, now: u64) -> bool {
        let until = self.circuit.open_until_ms.load(Ordering::Acquire);
        now >= until || now.saturating_add(self.cool_down_ms()) < until
    }

    fn open(&self, why: &str) {
        let until = self.now_ms().saturating_add(self.cool_down_ms());
        // The deadline is written before the state, so whoever sees OPEN sees its deadline.
        self.circuit.open_until_ms.store(until, Ordering::Release);
        self.circuit.state.store(OPEN, Ordering::Release);
        self.transition(BreakerState::Open, why);
    }

    /// The rest of the cool-down: at least 1 ms, so clients back off.
    fn retry_after_open_ms(&self) -> u64 {
        let left = self
            .circuit
            .open_until_ms
            .load(Ordering::Acquire)
            .saturating_sub(self.now_ms())
            .min(self.cool_down_ms());
        left.max(1)
    }

    fn on_closed(&self, failure: Option<bool>) {
        match failure {
            Some(true) => {
                let n = self.circuit.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= self.circuit.settings.failure_threshold
                    && self
                        .circuit
                        .state
                        .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.circuit.failures.store(0, Ordering::Release);
                    self.open(&format!(
                        "{n} consecutive unavailable or indeterminate outcomes"
                    ));
                }
            }
            // Read first: the common case (no failures) then writes nothing shared.
            Some(false) if self.circuit.failures.load(Ordering::Relaxed) != 0 => {
                self.circuit.failures.store(0, Ordering::Release);
            }
            _ => {}
        }
    }
}

/// Refusals of the caller's own making (admission, deadline) or of the breaker itself count
/// neither way; the others are the provider failing.
fn unavailable_failure(category: UnavailableCategory) -> Option<bool> {
    match category {
        UnavailableCategory::Admission
        | UnavailableCategory::Deadline
        | UnavailableCategory::CircuitOpen => None,
        _ => Some(true),
    }
}

/// Puts a half-open breaker back to open (probe now allowed again) if the probe's future is
/// dropped before it finished, so an abandoned probe cannot wedge the breaker half-open.
struct ProbeGuard<'a> {
    breaker: &'a CircuitBreaker,
    done: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker
                .circuit
                .open_until_ms
                .store(self.breaker.now_ms(), Ordering::Release);
            self.breaker.circuit.state.store(OPEN, Ordering::Release);
        }
    }
}

/// What the breaker counts of an outcome, single or multi-limit.
trait Counted {
    /// `Some(true)`: counts as a failure; `Some(false)`: a success; `None`: neither.
    fn failure(&self) -> Option<bool>;
}

/// A single or multi-limit outcome: their failures are the same.
impl<T> Counted for Outcome<T> {
    fn failure(&self) -> Option<bool> {
        match self {
            Outcome::Evaluated(_) => Some(false),
            Outcome::Indeterminate { .. } => Some(true),
            Outcome::Unavailable { category, .. } => unavailable_failure(*category),
            Outcome::Incompatible { .. } => None,
        }
    }
}

impl Counted for AcquireOutcome {
    fn failure(&self) -> Option<bool> {
        match self {
            AcquireOutcome::Acquired(_) | AcquireOutcome::Denied { .. } => Some(false),
            AcquireOutcome::Indeterminate { .. } => Some(true),
            AcquireOutcome::Unavailable { category, .. } => unavailable_failure(*category),
            AcquireOutcome::Incompatible { .. } => None,
        }
    }
}

impl Counted for ReleaseOutcome {
    fn failure(&self) -> Option<bool> {
        match self {
            ReleaseOutcome::Released | ReleaseOutcome::Expired | ReleaseOutcome::NotHeld => {
                Some(false)
            }
            ReleaseOutcome::Indeterminate { .. } => Some(true),
            ReleaseOutcome::Unavailable { category, .. } => unavailable_failure(*category),
            ReleaseOutcome::Incompatible { .. } => None,
        }
    }
}

impl CircuitBreaker {
    /// Runs `call` through the breaker: closed, it is sent and its outcome counted; open
    /// after the cool-down, it is the probe; otherwise `admit` checks the request and
    /// `refused` answers with the rest of the cool-down, without sending.
    async fn guarded<T: Counted>(
        &self,
        call: impl Future<Output = Result<T, RequestError>>,
        admit: impl FnOnce() -> Result<(), RequestError>,
        refused: impl FnOnce(u64) -> T,
    ) -> Result<T, RequestError> {
        match self.circuit.state.load(Ordering::Acquire) {
            CLOSED => {
                let outcome = call.await?;
                self.on_closed(outcome.failure());
                Ok(outcome)
            }
            OPEN if self.cooled_down(self.now_ms())
                && self
                    .circuit
                    .state
                    .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok() =>
            {
                self.transition(BreakerState::HalfOpen, "cool-down over, probing");
                let mut guard = ProbeGuard {
                    breaker: self,
                    done: false,
                };
                let result = call.await;
                guard.done = true;
                match &result {
                    Ok(outcome) if outcome.failure() == Some(true) => {
                        self.open("the probe failed");
                    }
                    _ => {
                        self.circuit.failures.store(0, Ordering::Release);
                        self.circuit.state.store(CLOSED, Ordering::Release);
                        self.transition(BreakerState::Closed, "the probe succeeded, closed");
                    }
                }
                result
            }
            _ => {
                // Open, or half-open with the probe in flight: refuse without sending. The
                // request is still checked, so a bad one is refused the same way as closed.
                admit()?;
                Ok(refused(self.retry_after_open_ms()))
            }
        }
    }
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for CircuitBreaker {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        let policy_id = request.policy_id.clone();
        let check = request.clone();
        self.guarded(
            self.inner.evaluate(request),
            || self.inner.policies().admit(&check).map(|_| ()),
            |retry_after_ms| RateLimitOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        let check = request.clone();
        let policy_id = request.limits.as_slice()[0].policy_id.clone();
        self.guarded(
            self.inner.evaluate_all(request),
            || self.inner.policies().admit_all(&check).map(|_| ()),
            |retry_after_ms| MultiOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        let policy_id = request.policy_id.clone();
        let check = request.policy_id.clone();
        self.guarded(
            self.inner.acquire_lease(request),
            || self.inner.policies().admit_lease(&check).map(|_| ()),
            |retry_after_ms| AcquireOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        let check = request.lease.policy_id.clone();
        self.guarded(
            self.inner.release_lease(request),
            || self.inner.policies().admit_lease(&check).map(|_| ()),
            |retry_after_ms| ReleaseOutcome::Unavailable {
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    async fn reserve(&self, request: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        let check = request.clone();
        let policy_id = request.limits.as_slice()[0].policy_id.clone();
        self.guarded(
            self.inner.reserve(request),
            || self.inner.policies().admit_reservation(&check).map(|_| ()),
            |retry_after_ms| ReserveOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    /// A settlement names no policy until its record is read: an open circuit refuses it
    /// under the default policy's id (nothing is charged; the reservation stays outstanding).
    async fn settle(&self, request: SettleRequest) -> Result<SettleOutcome, RequestError> {
        let policy_id = self.policies().default_id().clone();
        self.guarded(
            self.inner.settle(request),
            || Ok(()),
            |retry_after_ms| SettleOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    /// As [`Self::settle`].
    async fn cancel(&self, request: CancelRequest) -> Result<CancelOutcome, RequestError> {
        let policy_id = self.policies().default_id().clone();
        self.guarded(
            self.inner.cancel(request),
            || Ok(()),
            |retry_after_ms| CancelOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    async fn charge(&self, request: ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        let check = request.clone();
        // `admit_charge` refuses a request without limits before the default could be named.
        let policy_id = request
            .limits
            .first()
            .map_or_else(|| self.policies().default_id(), |l| &l.policy_id)
            .clone();
        self.guarded(
            self.inner.charge(request),
            || self.inner.policies().admit_charge(&check).map(|_| ()),
            |retry_after_ms| ChargeOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category: UnavailableCategory::CircuitOpen,
            },
        )
        .await
    }

    fn policies(&self) -> &PolicySet {
        self.inner.policies()
    }

    async fn readiness(&self) -> Readiness {
        match self.state() {
            BreakerState::Closed => self.inner.readiness().await,
            s => match self.inner.readiness().await {
                Readiness::Ready => Readiness::NotReady(format!(
                    "circuit breaker {} (the provider answers again; closing on the next probe)",
                    s.as_str()
                )),
                Readiness::NotReady(why) => {
                    Readiness::NotReady(format!("circuit breaker {}: {why}", s.as_str()))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::testing::ScriptedPort;
    use shared_contract::{
        Certainty, ChargeLimit, Cost, Deadline, ManualClock, PolicyId, PolicyRevision,
        RateLimitDecision, RateLimitPolicy, Source, SubjectDigest,
    };

    use super::*;

    fn policy_set() -> PolicySet {
        let id = PolicyId::new("api").expect("valid id");
        let api = RateLimitPolicy::fixed_window("api", 10)
            .per(Duration::from_secs(1))
            .build()
            .expect("valid policy");
        let jobs = RateLimitPolicy::concurrency("jobs", 2, Duration::from_secs(1))
            .build()
            .expect("valid policy");
        PolicySet::new([api, jobs], id).expect("valid set")
    }

    /// The provider down: `Unavailable(connect)`.
    fn down(r: &RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        Ok(RateLimitOutcome::Unavailable {
            policy_id: r.policy_id.clone(),
            retry_after_ms: 1000,
            category: UnavailableCategory::Connect,
        })
    }

    /// The provider up: an allow.
    fn up(r: &RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        Ok(RateLimitOutcome::Evaluated(RateLimitDecision {
            allowed: true,
            limit: 10,
            remaining: 9,
            retry_after_ms: 0,
            reset_at_ms: 0,
            policy_id: r.policy_id.clone(),
            revision: PolicyRevision::new(1).expect("valid"),
            source: Source::GlobalRedis,
            certainty: Certainty::Certain,
            fleet: None,
        }))
    }

    fn request() -> RateLimitRequest {
        RateLimitRequest {
            policy_id: PolicyId::new("api").expect("valid id"),
            subject: SubjectDigest::from_bytes([7; 32]),
            cost: Cost::ONE,
            evaluation_id: None,
            deadline: Deadline::within(Duration::from_secs(1)).expect("valid"),
        }
    }

    /// A breaker around a port that is down, on a manual clock at 1,000,000 ms.
    fn setup(
        threshold: u32,
        cool_down_ms: u64,
    ) -> (Arc<ScriptedPort>, CircuitBreaker, ManualClock) {
        let inner = Arc::new(ScriptedPort::new(policy_set(), down).with_leases(|r| {
            AcquireOutcome::Unavailable {
                policy_id: r.policy_id.clone(),
                retry_after_ms: 1000,
                category: UnavailableCategory::Connect,
            }
        }));
        let clock = ManualClock::new(1_000_000);
        let b = CircuitBreaker::with_clock(
            inner.clone(),
            BreakerSettings {
                enabled: true,
                failure_threshold: threshold,
                cool_down: Duration::from_millis(cool_down_ms),
            },
            Arc::new(clock.clone()),
        );
        (inner, b, clock)
    }

    fn retry_after_ms(o: &RateLimitOutcome) -> u64 {
        match o {
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::CircuitOpen,
                retry_after_ms,
                ..
            } => *retry_after_ms,
            other => panic!("expected circuit_open, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn opens_after_threshold_and_then_sends_nothing() {
        let (inner, b, _) = setup(3, 60_000);
        for _ in 0..3 {
            let o = b.evaluate(request()).await.expect("valid request");
            assert!(matches!(
                o,
                RateLimitOutcome::Unavailable {
                    category: UnavailableCategory::Connect,
                    ..
                }
            ));
        }
        assert_eq!(b.state(), BreakerState::Open);
        for _ in 0..10 {
            let o = b.evaluate(request()).await.expect("valid request");
            assert!(
                matches!(o, RateLimitOutcome::Unavailable { category: UnavailableCategory::CircuitOpen, retry_after_ms, .. } if retry_after_ms > 0),
                "{o:?}"
            );
        }
        assert_eq!(inner.calls(), 3, "an open circuit sends nothing");
    }

    #[tokio::test]
    async fn an_open_circuit_refuses_charges_after_checking_them() {
        let (_, b, _) = setup(1, 60_000);
        b.evaluate(request()).await.expect("valid request");
        assert_eq!(b.state(), BreakerState::Open);
        let charge = |policy: &str| ChargeRequest {
            limits: vec![ChargeLimit {
                policy_id: PolicyId::new(policy).expect("valid id"),
                subject: SubjectDigest::from_bytes([7; 32]),
                cost: 1,
            }],
            deadline: Deadline::within(Duration::from_secs(1)).expect("valid"),
        };
        let o = b.charge(charge("api")).await.expect("valid request");
        assert!(
            matches!(&o, ChargeOutcome::Unavailable { category: UnavailableCategory::CircuitOpen, policy_id, .. } if policy_id.as_str() == "api"),
            "{o:?}"
        );
        // A concurrency policy takes no charges: refused as when closed.
        let refused = b.charge(charge("jobs")).await;
        assert!(
            matches!(refused, Err(RequestError::ReservationUnsupported { .. })),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn successes_reset_the_count() {
        let (inner, b, _) = setup(3, 60_000);
        for _ in 0..2 {
            b.evaluate(request()).await.expect("valid request");
        }
        inner.script(up);
        b.evaluate(request()).await.expect("valid request");
        inner.script(down);
        for _ in 0..2 {
            b.evaluate(request()).await.expect("valid request");
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "2 + 2 failures, not 3 in a row"
        );
    }

    #[tokio::test]
    async fn half_open_probe_closes_on_success_and_reopens_on_failure() {
        let (inner, b, clock) = setup(1, 30);
        b.evaluate(request()).await.expect("valid request");
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(29);
        let o = b.evaluate(request()).await.expect("valid request");
        assert_eq!(retry_after_ms(&o), 1, "a millisecond of cool-down left");
        clock.advance(1);
        // Still down: the probe fails, the circuit opens again.
        let o = b.evaluate(request()).await.expect("valid request");
        assert!(matches!(
            o,
            RateLimitOutcome::Unavailable {
                category: UnavailableCategory::Connect,
                ..
            }
        ));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(inner.calls(), 2);
        clock.advance(30);
        inner.script(up);
        let o = b.evaluate(request()).await.expect("valid request");
        assert!(matches!(o, RateLimitOutcome::Evaluated(_)));
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test]
    async fn requests_are_still_checked_while_open() {
        let (_, b, _) = setup(1, 60_000);
        b.evaluate(request()).await.expect("valid request");
        let mut r = request();
        r.policy_id = PolicyId::new("other").expect("valid id");
        assert!(matches!(
            b.evaluate(r).await,
            Err(RequestError::UnknownPolicy(_))
        ));
    }

    #[tokio::test]
    async fn the_retry_hint_is_the_rest_of_the_cool_down() {
        let (_, b, clock) = setup(1, 60_000);
        b.evaluate(request()).await.expect("valid request");
        let o = b.evaluate(request()).await.expect("valid request");
        assert_eq!(retry_after_ms(&o), 60_000);
        clock.advance(20_000);
        let o = b.evaluate(request()).await.expect("valid request");
        assert_eq!(retry_after_ms(&o), 40_000);
    }

    #[tokio::test]
    async fn a_clock_that_goes_back_past_the_opening_ends_the_cool_down() {
        let (inner, b, clock) = setup(1, 60_000);
        b.evaluate(request()).await.expect("valid request");
        // Back, but not before the opening: still open, and the hint never exceeds the
        // cool-down.
        clock.set(1_000_000);
        let o = b.evaluate(request()).await.expect("valid request");
        assert_eq!(retry_after_ms(&o), 60_000);
        assert_eq!(inner.calls(), 1);
        // Before the opening: the cool-down cannot be measured, so one probe goes through.
        clock.set(999_999);
        inner.script(up);
        let o = b.evaluate(request()).await.expect("valid request");
        assert!(matches!(o, RateLimitOutcome::Evaluated(_)), "{o:?}");
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test]
    async fn an_abandoned_probe_lets_the_next_request_probe() {
        let (inner, b, clock) = setup(1, 30);
        b.evaluate(request()).await.expect("valid request");
        clock.advance(30);
        // The probe is sent and its future dropped before the answer.
        inner.stall(true);
        {
            let mut probe = std::pin::pin!(b.evaluate(request()));
            let waker = std::task::Waker::noop();
            let polled = probe
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker));
            assert!(polled.is_pending());
            assert_eq!(b.state(), BreakerState::HalfOpen);
        }
        assert_eq!(b.state(), BreakerState::Open, "the guard reopened it");
        inner.stall(false);
        inner.script(up);
        let o = b.evaluate(request()).await.expect("valid request");
        assert!(matches!(o, RateLimitOutcome::Evaluated(_)), "{o:?}");
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test]
    async fn lease_failures_open_the_breaker_which_then_sends_no_lease_call() {
        let (inner, b, _) = setup(1, 60_000);
        let acquire = |policy: &str| AcquireRequest {
            policy_id: PolicyId::new(policy).expect("valid id"),
            subject: SubjectDigest::from_bytes([7; 32]),
            deadline: Deadline::within(Duration::from_secs(1)).expect("valid"),
        };
        let o = b
            .acquire_lease(acquire("jobs"))
            .await
            .expect("a concurrency policy");
        assert!(matches!(
            o,
            AcquireOutcome::Unavailable {
                category: UnavailableCategory::Connect,
                ..
            }
        ));
        assert_eq!(b.state(), BreakerState::Open);
        let o = b
            .acquire_lease(acquire("jobs"))
            .await
            .expect("a concurrency policy");
        assert!(matches!(
            o,
            AcquireOutcome::Unavailable {
                category: UnavailableCategory::CircuitOpen,
                ..
            }
        ));
        let lease = shared_contract::LeaseId {
            policy_id: PolicyId::new("jobs").expect("valid id"),
            subject: SubjectDigest::from_bytes([7; 32]),
            token: shared_contract::LeaseToken::from_bytes([1; 16]),
        };
        let released = b
            .release_lease(ReleaseRequest {
                lease,
                deadline: Deadline::within(Duration::from_secs(1)).expect("valid"),
            })
            .await;
        assert!(matches!(
            released,
            Ok(ReleaseOutcome::Unavailable {
                category: UnavailableCategory::CircuitOpen,
                ..
            })
        ));
        // Still checked while open: a rate policy has no leases.
        assert!(matches!(
            b.acquire_lease(acquire("api")).await,
            Err(RequestError::NotConcurrencyPolicy { .. })
        ));
        assert_eq!(inner.calls(), 1, "nothing sent while open");
    }
}
