//! Concurrency leases at the edge: the [`Limiter`]'s acquire and release, with a deadline,
//! metrics and a tracing span (never the subject), for the HTTP API and the middleware.
//!
//! Metrics: `rate_limit_leases_total{policy, outcome}` counts every acquire and release by
//! its outcome (`acquired`, `denied`, `released`, `expired`, `not_held`, or the failure's
//! name); `rate_limit_lease_release_failures_total{policy}` counts releases that did not
//! answer (the lease then expires by its TTL).

use std::time::Instant;

use shared_contract::{
    AcquireOutcome, AcquireRequest, LeaseId, ReleaseOutcome, ReleaseRequest, RequestError,
    SubjectDigest,
};
use tracing::Instrument as _;

use crate::limiter::{Limiter, PolicyIndex};

/// Metric names of the leases, as `/metrics` shows them.
pub mod names {
    /// Lease acquires and releases, by `policy` and `outcome`.
    pub const LEASES: &str = "rate_limit_leases_total";
    /// Releases that did not answer, by `policy`: each such lease expires by its TTL.
    pub const RELEASE_FAILURES: &str = "rate_limit_lease_release_failures_total";
}

impl Limiter {
    /// Acquires one lease of the concurrency policy at `index` for `subject`.
    ///
    /// # Errors
    /// [`RequestError::NotConcurrencyPolicy`] for a rate policy, or what the port refuses;
    /// nothing was acquired.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub async fn acquire(
        &self,
        index: PolicyIndex,
        subject: SubjectDigest,
    ) -> Result<AcquireOutcome, RequestError> {
        let policy_id = self.policy(index).id().clone();
        let deadline = self.deadline(Instant::now());
        let span = tracing::debug_span!("lease_acquire", policy = %policy_id);
        let request = AcquireRequest {
            policy_id: policy_id.clone(),
            subject,
            deadline,
        };
        let outcome = self.port().acquire_lease(request).instrument(span).await?;
        metrics::counter!(names::LEASES, "policy" => policy_id.to_string(), "outcome" => outcome.name())
            .increment(1);
        Ok(outcome)
    }

    /// Releases `lease`, and no other.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`] or [`RequestError::NotConcurrencyPolicy`] for the
    /// lease id's policy; nothing was released.
    pub async fn release(&self, lease: LeaseId) -> Result<ReleaseOutcome, RequestError> {
        let policy_id = lease.policy_id.clone();
        let deadline = self.deadline(Instant::now());
        let span = tracing::debug_span!("lease_release", policy = %policy_id);
        let outcome = self
            .port()
            .release_lease(ReleaseRequest { lease, deadline })
            .instrument(span)
            .await?;
        let policy = policy_id.to_string();
        metrics::counter!(names::LEASES, "policy" => policy.clone(), "outcome" => outcome.name())
            .increment(1);
        if matches!(
            outcome,
            ReleaseOutcome::Unavailable { .. }
                | ReleaseOutcome::Indeterminate { .. }
                | ReleaseOutcome::Incompatible { .. }
        ) {
            metrics::counter!(names::RELEASE_FAILURES, "policy" => policy).increment(1);
        }
        Ok(outcome)
    }
}

/// The problem+json answers of a lease that was not acquired, shared by the HTTP API and the
/// middleware: 429 (`lease_limit_reached`) when every place is held, 503 when the provider
/// could not answer; both with `Retry-After` when a time is known.
pub mod respond {
    use http::{HeaderValue, Response, StatusCode, header};
    use serde_json::json;
    use shared_contract::AcquireOutcome;

    use crate::headers::ceil_secs;
    use crate::problem;

    /// The response to an acquire that holds no lease (`None` for `Acquired`).
    pub fn not_acquired<B: From<String>>(outcome: &AcquireOutcome) -> Option<Response<B>> {
        let (status, mut body, retry_ms) = match outcome {
            AcquireOutcome::Acquired(_) => return None,
            AcquireOutcome::Denied {
                policy_id,
                limit,
                retry_after_ms,
                ..
            } => (
                StatusCode::TOO_MANY_REQUESTS,
                json!({
                    "type": "about:blank",
                    "title": "Too Many Requests",
                    "status": 429,
                    "error": "lease_limit_reached",
                    "detail": format!("all {limit} leases of policy {policy_id} for this subject are held"),
                    "outcome": "denied",
                    "policy": policy_id.as_str(),
                    "limit": limit,
                    "retry_after_ms": retry_after_ms,
                }),
                (*retry_after_ms).max(1),
            ),
            AcquireOutcome::Unavailable {
                policy_id,
                retry_after_ms,
                category,
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                unavailable_body(outcome.name(), policy_id.as_str(), Some(category.as_str())),
                *retry_after_ms,
            ),
            AcquireOutcome::Indeterminate {
                policy_id,
                retry_after_ms,
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                unavailable_body(outcome.name(), policy_id.as_str(), None),
                *retry_after_ms,
            ),
            AcquireOutcome::Incompatible {
                policy_id,
                category,
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                unavailable_body(outcome.name(), policy_id.as_str(), Some(category.as_str())),
                0,
            ),
        };
        if status == StatusCode::SERVICE_UNAVAILABLE && retry_ms > 0 {
            body["retry_after_ms"] = retry_ms.into();
        }
        let mut r = problem::respond(status, body);
        if retry_ms > 0 {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(ceil_secs(retry_ms).max(1)),
            );
        }
        Some(r)
    }

    fn unavailable_body(outcome: &str, policy: &str, category: Option<&str>) -> serde_json::Value {
        let mut body = json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "error": "lease_unavailable",
            "detail": "the limiter could not acquire a lease; no lease is held by this answer",
            "outcome": outcome,
            "policy": policy,
        });
        if let Some(c) = category {
            body["category"] = c.into();
        }
        body
    }
}
