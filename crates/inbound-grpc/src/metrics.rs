//! The gRPC server's decision metrics: the HTTP edge's names and labels
//! ([`edge_middleware::limiter::names`]), so that one dashboard shows both.
//!
//! Each limit of an evaluation counts under its own policy: `allowed` or `denied` as its own
//! decision said (a limit that would have admitted in a denied evaluation counts `allowed`,
//! although nothing was charged), or the evaluation's failure (`unavailable`,
//! `indeterminate`, `incompatible`) for every limit of it. Every limit with a decision also
//! counts under its decision's source (`rate_limit_decisions_by_source_total`). Handles are
//! registered once, when the service is built.

use std::collections::HashMap;
use std::time::Duration;

use edge_middleware::limiter::{PolicyMetrics, names};
use shared_contract::{MultiOutcome, PolicyId, PolicySet, RateLimitOutcome, RateLimitPolicy};

/// Every policy's handles.
#[derive(Debug)]
pub(crate) struct Metrics {
    by_policy: HashMap<PolicyId, PolicyMetrics>,
}

impl Metrics {
    pub(crate) fn new(policies: &PolicySet) -> Self {
        let by_policy = policies
            .iter()
            .map(|p| (p.id().clone(), PolicyMetrics::new(p.id())))
            .collect();
        Self { by_policy }
    }

    /// Records one evaluation of `policies` (in limit order) that answered `outcome`.
    pub(crate) fn record(
        &self,
        policies: &[RateLimitPolicy],
        outcome: &MultiOutcome,
        elapsed: Duration,
    ) {
        for (i, p) in policies.iter().enumerate() {
            let Some(m) = self.by_policy.get(p.id()) else {
                continue;
            };
            m.latency.record(elapsed.as_secs_f64());
            let counter = match outcome {
                MultiOutcome::Evaluated(d) => match d.decisions.get(i) {
                    Some(decision) => {
                        m.count_source(decision.source);
                        if decision.allowed {
                            &m.allowed
                        } else {
                            &m.denied
                        }
                    }
                    None => &m.denied,
                },
                MultiOutcome::Unavailable { .. } => &m.unavailable,
                MultiOutcome::Indeterminate { .. } => &m.indeterminate,
                MultiOutcome::Incompatible { .. } => &m.incompatible,
            };
            counter.increment(1);
        }
        Self::record_error(outcome);
    }

    /// Records one evaluation of a limit in shadow mode: a denial counts `shadow_denied`.
    pub(crate) fn record_shadow(
        &self,
        policy: &RateLimitPolicy,
        outcome: &RateLimitOutcome,
        elapsed: Duration,
    ) {
        let Some(m) = self.by_policy.get(policy.id()) else {
            return;
        };
        m.latency.record(elapsed.as_secs_f64());
        if let RateLimitOutcome::Evaluated(d) = outcome {
            m.count_source(d.source);
        }
        let counter = match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => &m.allowed,
            RateLimitOutcome::Evaluated(_) => &m.shadow_denied,
            RateLimitOutcome::Unavailable { .. } => &m.unavailable,
            RateLimitOutcome::Indeterminate { .. } => &m.indeterminate,
            RateLimitOutcome::Incompatible { .. } => &m.incompatible,
        };
        counter.increment(1);
        if let Some(category) = outcome.error_category() {
            metrics::counter!(names::PROVIDER_ERRORS, "category" => category).increment(1);
        }
    }

    fn record_error(outcome: &MultiOutcome) {
        if let Some(category) = outcome.error_category() {
            metrics::counter!(names::PROVIDER_ERRORS, "category" => category).increment(1);
        }
    }
}
