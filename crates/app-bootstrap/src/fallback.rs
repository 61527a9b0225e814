//! `fallback_local`: when the global provider cannot decide, a per-instance local limiter
//! does, and says so (`source = local_fallback`, `certainty = approximate_fallback`: N
//! instances may together admit up to N times the limit while the global provider is down).
//!
//! Applies to `Unavailable`, `Indeterminate` and `Incompatible` outcomes alike: each means
//! "no global answer", and the fallback's answer never claims to be one. The provider's own
//! outcome is counted (`rate_limit_fallback_total{reason}`) so operators see why.
//!
//! Leases are never taken locally: a lease held in one instance's memory could not be
//! released through another, and its place would count on that instance alone. Acquire and
//! release go to the global provider, and a concurrency policy's failure is handled at the
//! edge like `fail_closed` (or `fail_open` when the policy says so).

use std::sync::Arc;
use std::time::Duration;

use adapter_local::LocalProvider;
use shared_contract::{
    AcquireOutcome, AcquireRequest, Deadline, EdgeRateLimitPort, FailurePolicy, MultiOutcome,
    MultiRequest, Outcome, PolicyId, PolicySet, RateLimitOutcome, RateLimitRequest, Readiness,
    ReleaseOutcome, ReleaseRequest, RequestError,
};

/// See the module docs.
#[derive(Debug)]
pub struct LocalFallback {
    inner: Arc<dyn EdgeRateLimitPort>,
    fallback: Arc<LocalProvider>,
}

impl LocalFallback {
    /// `fallback` should be built with [`LocalProvider::fallback`], so its decisions report
    /// `local_fallback`.
    pub fn new(inner: Arc<dyn EdgeRateLimitPort>, fallback: impl Into<Arc<LocalProvider>>) -> Self {
        Self {
            inner,
            fallback: fallback.into(),
        }
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
        if matches!(outcome, RateLimitOutcome::Evaluated(_)) || !self.falls_back(&request.policy_id)
        {
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
        self.fallback.evaluate_now(&RateLimitRequest {
            deadline,
            ..request
        })
    }

    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        let outcome = self.inner.evaluate_all(request.clone()).await?;
        if !request.limits.iter().all(|l| self.falls_back(&l.policy_id)) {
            // A policy of this evaluation does not ask for the fallback: its own failure
            // policy applies to the whole evaluation, at the edge.
            return Ok(outcome);
        }
        if matches!(outcome, MultiOutcome::Evaluated(_)) {
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
        self.fallback.evaluate_all_now(&MultiRequest {
            deadline,
            evaluation_id: None,
            ..request
        })
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        self.inner.acquire_lease(request).await
    }

    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        self.inner.release_lease(request).await
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
