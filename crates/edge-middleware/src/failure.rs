//! The one rule for a multi-limit evaluation that the provider could not decide (unavailable,
//! indeterminate, incompatible), shared by the middleware, the HTTP list form of
//! `/v1/evaluate` and the gRPC rate-limit service, so that the same request gets the same
//! answer, naming the same policy, on every surface.
//!
//! The failure concerns the whole evaluation, not one of its limits, so the policy it is
//! answered for is chosen by the limits' failure policies: **the strictest one decides**
//! (anything but `fail_open` wins over `fail_open`), and the answer names the first policy, in
//! request order, whose failure policy decided. When every policy fails open the request goes
//! through, naming the first one.

use shared_contract::{FailurePolicy, MultiOutcome, RateLimitOutcome, RateLimitPolicy};

/// The position, among `policies` (those of an evaluation's limits, in request order), of the
/// policy whose failure policy decides when the evaluation could not be decided: the first one
/// that does not fail open, or the first one when every one fails open. `None` when
/// `policies` is empty.
pub fn deciding_policy<'a>(
    policies: impl IntoIterator<Item = &'a RateLimitPolicy>,
) -> Option<usize> {
    let mut first = None;
    for (i, p) in policies.into_iter().enumerate() {
        if p.failure_policy() != FailurePolicy::FailOpen {
            return Some(i);
        }
        first.get_or_insert(i);
    }
    first
}

/// `failure`, the outcome of an evaluation of limits of `policies` (in request order) that the
/// provider could not decide, as the single outcome of the policy that decides
/// ([`deciding_policy`]): the same failure, naming that policy. With that policy: it fails
/// open exactly when the request goes through. An `Evaluated` outcome is its first decision, as
/// [`MultiOutcome::into_single`] has it. `None` when `policies` is empty.
pub fn failure_outcome<'a>(
    policies: &[&'a RateLimitPolicy],
    failure: MultiOutcome,
) -> Option<(&'a RateLimitPolicy, RateLimitOutcome)> {
    let policy = *policies.get(deciding_policy(policies.iter().copied())?)?;
    // The provider names the limit where it failed; the answer names the deciding policy.
    let outcome = match failure.decided() {
        Ok(evaluated) => MultiOutcome::Evaluated(evaluated).into_single(policy.id()),
        Err(failure) => RateLimitOutcome::failed_at(failure, policy.id().clone()),
    };
    Some((policy, outcome))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::UnavailableCategory;

    use super::*;

    fn policy(id: &str, failure_policy: FailurePolicy) -> RateLimitPolicy {
        RateLimitPolicy::fixed_window(id, 5)
            .per(Duration::from_secs(60))
            .failure_policy(failure_policy)
            .build()
            .expect("valid policy")
    }

    #[test]
    fn the_first_policy_that_does_not_fail_open_decides_else_the_first() {
        let open = policy("open", FailurePolicy::FailOpen);
        let also_open = policy("also_open", FailurePolicy::FailOpen);
        let fw = policy("fw", FailurePolicy::FailClosed);
        let local = policy("local", FailurePolicy::FallbackLocal);
        assert_eq!(deciding_policy([&open, &fw]), Some(1));
        assert_eq!(deciding_policy([&fw, &open]), Some(0));
        assert_eq!(deciding_policy([&open, &local, &fw]), Some(1));
        assert_eq!(deciding_policy([&open, &also_open]), Some(0));
        assert_eq!(deciding_policy([]), None);
    }

    #[test]
    fn a_mixed_failure_names_the_fail_closed_policy_whatever_the_provider_named() {
        let open = policy("open", FailurePolicy::FailOpen);
        let fw = policy("fw", FailurePolicy::FailClosed);
        let failure = MultiOutcome::Unavailable {
            policy_id: open.id().clone(),
            retry_after_ms: 1000,
            category: UnavailableCategory::Connect,
        };
        let (decided, outcome) = failure_outcome(&[&open, &fw], failure).expect("a policy");
        assert_eq!(decided.id().as_str(), "fw");
        assert_eq!(outcome.policy_id().as_str(), "fw");
        assert!(matches!(
            outcome,
            RateLimitOutcome::Unavailable {
                retry_after_ms: 1000,
                ..
            }
        ));
        let failure = MultiOutcome::Indeterminate {
            policy_id: fw.id().clone(),
            retry_after_ms: 0,
        };
        let (decided, outcome) = failure_outcome(&[&open], failure).expect("a policy");
        assert_eq!(decided.failure_policy(), FailurePolicy::FailOpen);
        assert_eq!(outcome.policy_id().as_str(), "open");
    }
}
