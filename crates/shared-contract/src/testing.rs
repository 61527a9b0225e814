//! Test doubles for code built on the port (feature `testing`): a port whose answers the test
//! scripts ([`ScriptedPort`]), and [`one_by_one`], the non-atomic multi-limit evaluation such
//! doubles answer with. Policies for them come from the builders
//! ([`RateLimitPolicy::fixed_window`](crate::RateLimitPolicy::fixed_window) and its siblings).
//!
//! ```
//! use shared_contract::testing::ScriptedPort;
//! use shared_contract::{PolicyId, PolicySet, RateLimitPolicy, UnavailableCategory};
//!
//! let api = RateLimitPolicy::fixed_window("api", 5).build().expect("valid policy");
//! let policies = PolicySet::new([api], PolicyId::new("api").expect("valid id")).expect("valid set");
//! // Every evaluation answers `Unavailable(connect)`, retry after 1 s.
//! let port = ScriptedPort::unavailable(policies, UnavailableCategory::Connect, 1000);
//! assert_eq!(port.calls(), 0);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::decision::{
    Certainty, Outcome, RateLimitDecision, RateLimitOutcome, Source, UnavailableCategory,
};
use crate::lease::{AcquireOutcome, AcquireRequest};
use crate::port::multi::{MultiOutcome, MultiRequest};
use crate::port::{EdgeRateLimitPort, PolicySet, RateLimitRequest, Readiness, RequestError};

/// What a [`ScriptedPort`] answers an evaluation.
type Answer =
    Box<dyn Fn(&RateLimitRequest) -> Result<RateLimitOutcome, RequestError> + Send + Sync>;

/// What a [`ScriptedPort`] answers an acquire.
type LeaseAnswer = Box<dyn Fn(&AcquireRequest) -> AcquireOutcome + Send + Sync>;

/// A port that answers what the test scripted: every evaluation through one function (which
/// the test may replace while the port is in use), multi-limit evaluations [`one_by_one`],
/// acquires through an optional second function. It charges nothing and counts its calls.
pub struct ScriptedPort {
    policies: PolicySet,
    answer: Mutex<Answer>,
    leases: Option<LeaseAnswer>,
    stalled: AtomicBool,
    readiness: Readiness,
    calls: AtomicU64,
}

impl fmt::Debug for ScriptedPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedPort")
            .field("policies", &self.policies.iter().count())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl ScriptedPort {
    /// A port of `policies` that answers every evaluation with `answer`.
    pub fn new(
        policies: PolicySet,
        answer: impl Fn(&RateLimitRequest) -> Result<RateLimitOutcome, RequestError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            policies,
            answer: Mutex::new(Box::new(answer)),
            leases: None,
            stalled: AtomicBool::new(false),
            readiness: Readiness::Ready,
            calls: AtomicU64::new(0),
        }
    }

    /// Every evaluation is `Unavailable(category)` for its policy (a provider that is down).
    pub fn unavailable(
        policies: PolicySet,
        category: UnavailableCategory,
        retry_after_ms: u64,
    ) -> Self {
        Self::new(policies, move |r| {
            Ok(Outcome::Unavailable {
                policy_id: r.policy_id.clone(),
                retry_after_ms,
                category,
            })
        })
    }

    /// Every evaluation is `Indeterminate` for its policy (sent, result unknown).
    pub fn indeterminate(policies: PolicySet, retry_after_ms: u64) -> Self {
        Self::new(policies, move |r| {
            Ok(Outcome::Indeterminate {
                policy_id: r.policy_id.clone(),
                retry_after_ms,
            })
        })
    }

    /// Every evaluation is allowed with `remaining` left, by its policy's limit and revision,
    /// source `local`; a policy not in `policies` is [`RequestError::UnknownPolicy`].
    pub fn allowing(policies: PolicySet, remaining: u64) -> Self {
        Self::allowing_with(policies, move |_| remaining)
    }

    /// [`Self::allowing`] with `remaining(request)` left.
    pub fn allowing_with(
        policies: PolicySet,
        remaining: impl Fn(&RateLimitRequest) -> u64 + Send + Sync + 'static,
    ) -> Self {
        let known = policies.clone();
        Self::new(policies, move |r| {
            let policy = known
                .get(&r.policy_id)
                .ok_or_else(|| RequestError::UnknownPolicy(r.policy_id.clone()))?;
            Ok(Outcome::Evaluated(RateLimitDecision {
                allowed: true,
                limit: policy.algorithm().limit(),
                remaining: remaining(r),
                retry_after_ms: 0,
                reset_at_ms: 0,
                policy_id: r.policy_id.clone(),
                revision: policy.revision(),
                source: Source::Local,
                certainty: Certainty::Certain,
                fleet: None,
            }))
        })
    }

    /// Evaluations answer `outcomes` in order; once they are used up, each answers
    /// [`RequestError::UnknownPolicy`] (a test asking more than it scripted fails loudly).
    pub fn in_order(
        policies: PolicySet,
        outcomes: impl IntoIterator<Item = RateLimitOutcome>,
    ) -> Self {
        let queue = Mutex::new(outcomes.into_iter().collect::<VecDeque<_>>());
        Self::new(policies, move |r| {
            let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            next.ok_or_else(|| RequestError::UnknownPolicy(r.policy_id.clone()))
        })
    }

    /// Acquires answer `answer` (without it, the port does not support leases), after the
    /// policy set has admitted the lease's policy.
    #[must_use]
    pub fn with_leases(
        mut self,
        answer: impl Fn(&AcquireRequest) -> AcquireOutcome + Send + Sync + 'static,
    ) -> Self {
        self.leases = Some(Box::new(answer));
        self
    }

    /// `readiness()` answers `readiness` instead of `Ready`.
    #[must_use]
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// From now on, evaluations answer `answer` (a provider that goes down or comes back).
    pub fn script(
        &self,
        answer: impl Fn(&RateLimitRequest) -> Result<RateLimitOutcome, RequestError>
        + Send
        + Sync
        + 'static,
    ) {
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = Box::new(answer);
    }

    /// While `stalled`, evaluations and acquires never complete (a provider that hangs; the
    /// caller's timeout or cancellation must end them).
    pub fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Evaluations (each limit of a multi-limit evaluation counts) and acquires so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Counts a call, and never returns while the port is stalled.
    async fn called(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.stalled.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for ScriptedPort {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        self.called().await;
        let answer = self.answer.lock().unwrap_or_else(|p| p.into_inner());
        answer(&request)
    }

    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        one_by_one(self, request).await
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        self.called().await;
        let Some(answer) = &self.leases else {
            return Err(RequestError::LeasesUnsupported);
        };
        self.policies.admit_lease(&request.policy_id)?;
        Ok(answer(&request))
    }

    fn policies(&self) -> &PolicySet {
        &self.policies
    }

    async fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }
}

/// Evaluates each limit alone through [`EdgeRateLimitPort::evaluate`] and joins the outcomes
/// with [`MultiOutcome::combine`]. **Not atomic**: for test doubles that charge nothing.
///
/// # Errors
/// The first [`RequestError`] of a member.
pub async fn one_by_one<P: EdgeRateLimitPort + ?Sized>(
    port: &P,
    request: MultiRequest,
) -> Result<MultiOutcome, RequestError> {
    let mut outcomes = Vec::with_capacity(request.limits.len());
    for l in request.limits.iter() {
        let one = RateLimitRequest {
            policy_id: l.policy_id.clone(),
            subject: l.subject,
            cost: l.cost,
            evaluation_id: None,
            deadline: request.deadline,
        };
        outcomes.push(port.evaluate(one).await?);
    }
    Ok(MultiOutcome::combine(outcomes))
}
