//! Rate-limit values and calls for tests, built in one place: policies of any algorithm,
//! policy sets, subjects, requests, and evaluations whose only interesting answer is a
//! decision.
//!
//! [`algorithm`] gives the parameters of one algorithm that admit `limit` at once and recover
//! fully over a span, so a test can run one scenario on every algorithm. [`TestPolicy`] holds
//! the other fields with defaults a test overrides where its scenario depends on them.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shared_contract::{
    AlgorithmKind, AlgorithmSpec, Cost, Deadline, EdgeRateLimitPort, FailurePolicy, PolicyId,
    PolicyRevision, PolicySet, PolicySpec, RateLimitOutcome, RateLimitPolicy, RateLimitRequest,
    SubjectDigest,
};

/// Parameters of `kind` admitting `limit` at once and fully recovering over `span`: the
/// window, the refill interval of a bucket refilling `limit`, or the GCRA period with a burst
/// of `limit`.
///
/// # Panics
/// For an algorithm this function does not know yet (the enum is non-exhaustive).
pub fn algorithm(kind: AlgorithmKind, limit: u64, span: Duration) -> AlgorithmSpec {
    match kind {
        AlgorithmKind::FixedWindow => AlgorithmSpec::FixedWindow {
            limit,
            window: span,
        },
        AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow {
            limit,
            window: span,
        },
        AlgorithmKind::TokenBucket => AlgorithmSpec::TokenBucket {
            capacity: limit,
            refill_amount: limit,
            refill_interval: span,
        },
        AlgorithmKind::Gcra => AlgorithmSpec::Gcra {
            limit,
            period: span,
            burst: limit,
        },
        AlgorithmKind::SlidingLog => AlgorithmSpec::SlidingLog {
            limit,
            window: span,
        },
        other => panic!("no test parameters for algorithm {other}: add them here"),
    }
}

/// A policy under construction: `algorithm` under `id`, revision 1, `max_cost` 1, a cleanup
/// grace of 60 s, a clock regression of 1 s and `fail_closed`, until a setter says otherwise.
#[derive(Debug, Clone)]
pub struct TestPolicy {
    spec: PolicySpec,
}

impl TestPolicy {
    /// # Panics
    /// When `id` is not a valid policy id.
    pub fn new(id: &str, algorithm: AlgorithmSpec) -> Self {
        Self::with_id(PolicyId::new(id).expect("a valid policy id"), algorithm)
    }

    pub fn with_id(id: PolicyId, algorithm: AlgorithmSpec) -> Self {
        Self {
            spec: PolicySpec {
                id,
                revision: PolicyRevision::new(1).expect("1 is a valid revision"),
                algorithm,
                max_cost: 1,
                cleanup_grace: Duration::from_secs(60),
                max_clock_regression: Duration::from_secs(1),
                failure_policy: FailurePolicy::FailClosed,
            },
        }
    }

    /// `kind` admitting `limit` at once and recovering over `span` (see [`algorithm`]).
    ///
    /// # Panics
    /// As [`TestPolicy::new`] and [`algorithm`].
    pub fn of(id: &str, kind: AlgorithmKind, limit: u64, span: Duration) -> Self {
        Self::new(id, algorithm(kind, limit, span))
    }

    /// # Panics
    /// When `revision` is 0.
    #[must_use]
    pub fn revision(mut self, revision: u32) -> Self {
        self.spec.revision = PolicyRevision::new(revision).expect("a valid revision");
        self
    }

    #[must_use]
    pub fn max_cost(mut self, max_cost: u64) -> Self {
        self.spec.max_cost = max_cost;
        self
    }

    #[must_use]
    pub fn cleanup_grace(mut self, grace: Duration) -> Self {
        self.spec.cleanup_grace = grace;
        self
    }

    #[must_use]
    pub fn max_clock_regression(mut self, regression: Duration) -> Self {
        self.spec.max_clock_regression = regression;
        self
    }

    /// # Panics
    /// When validation refuses the policy: a test's policy is valid by intent.
    pub fn build(self) -> RateLimitPolicy {
        RateLimitPolicy::new(self.spec).unwrap_or_else(|e| panic!("a valid test policy: {e}"))
    }
}

/// A set of `policies`, the first one the default.
///
/// # Panics
/// When `policies` is empty or names one id twice.
pub fn policy_set(policies: Vec<RateLimitPolicy>) -> PolicySet {
    let default = policies[0].id().clone();
    PolicySet::new(policies, default).expect("a valid policy set")
}

/// A request of `cost` on `policy` for `subject`, with a 10 s deadline.
///
/// # Panics
/// When `cost` is not a valid cost.
pub fn request(policy: &RateLimitPolicy, subject: SubjectDigest, cost: u64) -> RateLimitRequest {
    RateLimitRequest {
        policy_id: policy.id().clone(),
        subject,
        cost: Cost::new(cost).expect("a valid cost"),
        evaluation_id: None,
        deadline: Deadline::within(Duration::from_secs(10)).expect("a valid deadline"),
    }
}

/// A random u64 from the standard library's per-process random keys (no `rand` dependency).
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A fresh random subject digest.
pub fn fresh_subject() -> SubjectDigest {
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&random_u64().to_le_bytes());
    }
    SubjectDigest::from_bytes(bytes)
}

/// The subject whose 32 bytes are all `tag`: fixed, readable in a failure message.
pub fn subject(tag: u8) -> SubjectDigest {
    SubjectDigest::from_bytes([tag; 32])
}

/// The outcome of a request of cost 1 on `policy` for `subject`.
///
/// # Panics
/// When the port refuses the request itself (unknown policy, cost above `max_cost`).
pub async fn outcome(
    port: &dyn EdgeRateLimitPort,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
) -> RateLimitOutcome {
    port.evaluate(request(policy, subject, 1))
        .await
        .expect("an acceptable request")
}

/// Whether a request of cost 1 is allowed.
///
/// # Panics
/// When the outcome is not a decision.
pub async fn allowed(
    port: &dyn EdgeRateLimitPort,
    policy: &RateLimitPolicy,
    subject: SubjectDigest,
) -> bool {
    match outcome(port, policy, subject).await {
        RateLimitOutcome::Evaluated(d) => d.allowed,
        other => panic!("expected a decision, got {other:?}"),
    }
}
