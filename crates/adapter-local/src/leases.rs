//! Concurrency leases on the local store: each acquire and release is
//! [`shared_contract::model::concurrency`] applied to the subject's leases under the key's
//! lock, so the local provider holds leases exactly like the model (and so like the Redis
//! programs that mirror it).
//!
//! A key's entry lives `lease_ttl` (plus cleanup grace and clock tolerance) after its last
//! write, so the leases of a crashed holder are forgotten once they have expired; expiry
//! never changes a decision, since an expired lease holds no place anyway. Eviction (more than
//! `max_keys` live keys) forgets a subject's leases like any state (see the crate docs).

use shared_contract::lease::Lease;
use shared_contract::model::concurrency::{self, Acquire, ConcurrencyState, Release};
use shared_contract::model::{AlgorithmState, ModelError};
use shared_contract::{
    AcquireOutcome, AcquireRequest, Certainty, IncompatibleCategory, LeaseId, PolicyId,
    RateLimitPolicy, ReleaseOutcome, ReleaseRequest, RequestError,
};

use crate::LocalProvider;
use crate::store::Key;

/// The leases in a key's state; another algorithm's state there is incompatible.
fn leases_of(state: Option<&AlgorithmState>) -> Result<Option<&ConcurrencyState>, ModelError> {
    match state {
        None => Ok(None),
        Some(AlgorithmState::Concurrency(s)) => Ok(Some(s)),
        Some(_) => Err(ModelError::StateIncompatible("state of another algorithm")),
    }
}

impl LocalProvider {
    /// The store key and entry lifetime of `subject` under `policy`.
    fn lease_key(
        &self,
        policy: &RateLimitPolicy,
        subject: &shared_contract::SubjectDigest,
    ) -> Result<(Key, u64), RequestError> {
        // Every policy of the set got a slot at construction.
        let slot = self
            .slots
            .get(policy.id())
            .ok_or_else(|| RequestError::UnknownPolicy(policy.id().clone()))?
            .slot;
        Ok((Key::new(&slot.mask, subject.as_bytes()), slot.lifetime_ms))
    }

    /// Acquires one lease now, without an executor (see [`shared_contract::EdgeRateLimitPort::acquire_lease`]).
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`] or [`RequestError::NotConcurrencyPolicy`]; nothing is
    /// acquired.
    pub fn acquire_now(&self, request: &AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        let (policy, params) = self.policies.admit_lease(&request.policy_id)?;
        let (key, lifetime_ms) = self.lease_key(policy, &request.subject)?;
        let token = self.tokens.next_token();
        let id = || LeaseId {
            policy_id: policy.id().clone(),
            subject: request.subject,
            token,
        };
        let incompatible = || AcquireOutcome::Incompatible {
            policy_id: policy.id().clone(),
            category: IncompatibleCategory::State,
        };
        Ok(self
            .store
            .update(key, &*self.clock, lifetime_ms, |state, now_ms| {
                let Ok(state) = leases_of(state) else {
                    return (None, incompatible());
                };
                match concurrency::acquire(&params, state, now_ms, token) {
                    Ok(Acquire::Acquired {
                        expires_at_ms,
                        remaining,
                        new_state,
                    }) => (
                        Some(AlgorithmState::Concurrency(new_state)),
                        AcquireOutcome::Acquired(Lease {
                            certainty: self.certainty.unwrap_or(Certainty::Certain),
                            ..Lease::new(
                                policy,
                                &params,
                                id(),
                                expires_at_ms,
                                remaining,
                                self.source,
                            )
                        }),
                    ),
                    Ok(Acquire::Denied { retry_after_ms }) => (
                        None,
                        AcquireOutcome::Denied {
                            policy_id: policy.id().clone(),
                            limit: params.limit(),
                            retry_after_ms,
                            source: self.source,
                        },
                    ),
                    Err(_) => (None, incompatible()),
                }
            }))
    }

    /// Releases the lease `request` names, and no other, now, without an executor.
    ///
    /// # Errors
    /// [`RequestError::UnknownPolicy`] or [`RequestError::NotConcurrencyPolicy`] for the
    /// lease id's policy; nothing is released.
    pub fn release_now(&self, request: &ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        let lease = &request.lease;
        let (policy, _) = self.policies.admit_lease(&lease.policy_id)?;
        let (key, lifetime_ms) = self.lease_key(policy, &lease.subject)?;
        let incompatible = ReleaseOutcome::Incompatible {
            category: IncompatibleCategory::State,
        };
        Ok(self
            .store
            .update(key, &*self.clock, lifetime_ms, |state, now_ms| {
                let Ok(state) = leases_of(state) else {
                    return (None, incompatible);
                };
                match concurrency::release(state, now_ms, lease.token) {
                    Ok((verdict, new_state)) => (
                        new_state.map(AlgorithmState::Concurrency),
                        match verdict {
                            Release::Released => ReleaseOutcome::Released,
                            Release::Expired => ReleaseOutcome::Expired,
                            Release::NotHeld => ReleaseOutcome::NotHeld,
                        },
                    ),
                    Err(_) => (None, incompatible),
                }
            }))
    }

    /// Leases of `subject` under `policy` held now (for tests and diagnostics).
    pub fn held_leases(&self, policy: &PolicyId, subject: &shared_contract::SubjectDigest) -> u64 {
        let Ok((policy, _)) = self.policies.admit_lease(policy) else {
            return 0;
        };
        let Ok((key, lifetime_ms)) = self.lease_key(policy, subject) else {
            return 0;
        };
        self.store.update(
            key,
            &*self.clock,
            lifetime_ms,
            |state, now_ms| match state {
                Some(AlgorithmState::Concurrency(s)) => (None, s.held(now_ms) as u64),
                _ => (None, 0),
            },
        )
    }
}
