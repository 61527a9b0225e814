//! Checks and charges after the work on the local store
//! ([`shared_contract::EdgeRateLimitPort::charge`]): a charge is
//! [`shared_contract::model::reserve::charge`] (past the limit if need be, into an overdraft),
//! all the charges of a request under their keys' locks together; a check is an evaluation of
//! a cost of 1 that writes nothing.

use shared_contract::model::reserve;
use shared_contract::model::{self, Verdict};
use shared_contract::{
    ChargeOutcome, ChargeRequest, Cost, IncompatibleCategory, MultiDecision, Outcome, PolicyId,
    RateLimitDecision, RateLimitPolicy, RequestError, SubjectDigest, UnavailableCategory,
};

use crate::LocalProvider;
use crate::reservations::written;
use crate::store::Key;

impl LocalProvider {
    /// Checks and charges now, without an executor (see
    /// [`shared_contract::EdgeRateLimitPort::charge`]).
    ///
    /// # Errors
    /// As [`shared_contract::PolicySet::admit_charge`]; nothing is charged.
    pub fn charge_now(&self, request: &ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        let policies = self.policies.admit_charge(request)?;
        let limits = request.limits.iter().zip(&policies);
        let keys = self.keys_of(limits.map(|(l, p)| (*p, l.subject)))?;
        let charged: Vec<usize> = (0..policies.len())
            .filter(|&i| request.limits[i].cost > 0)
            .collect();
        let mut decisions: Vec<Option<RateLimitDecision>> = vec![None; policies.len()];
        if let Err(failure) = self.charge_all(request, &policies, &keys, &charged, &mut decisions) {
            return Ok(failure);
        }
        for i in (0..policies.len()).filter(|i| !charged.contains(i)) {
            let policy = policies[i];
            let (key, lifetime) = keys[i];
            let evaluated = self
                .store
                .update(key, &*self.clock, lifetime, |state, now| {
                    (None, model::decide(policy, state, now, Cost::ONE))
                });
            match evaluated {
                Ok(e) => match self.decided(policy, &e) {
                    Some(d) => decisions[i] = Some(d),
                    None => return Ok(clock_unsafe(policy, e.retry_after_ms)),
                },
                Err(_) => return Ok(incompatible(policy)),
            }
        }
        let decisions: Vec<RateLimitDecision> = decisions.into_iter().flatten().collect();
        Ok(Outcome::Evaluated(MultiDecision {
            allowed: decisions.iter().all(|d| d.allowed),
            decisions,
            replayed: false,
        }))
    }

    /// Charges `cost` to `subject` under `policy_id` as of `at_ms`, an earlier time than now,
    /// past the limit if need be ([`reserve::charge_spent`] at `at_ms`: up to the policy's
    /// whole limit; a sliding log takes what fits): what the fleet-share fallback charges when
    /// it starts deciding for a key the global provider last answered for at `at_ms`, so that
    /// it admits no more than that answer left. The model's clock rule applies: a state
    /// written after `at_ms` takes the charge at its own time when within the policy's
    /// tolerance, and beyond it nothing is written. Whether a charge was written (`false` also
    /// for an unknown or concurrency policy, a cost of 0 or above the limit, a full log).
    pub fn charge_as_of(
        &self,
        policy_id: &PolicyId,
        subject: &SubjectDigest,
        cost: u64,
        at_ms: u64,
    ) -> bool {
        let Some(held) = self.slots.get(policy_id) else {
            return false;
        };
        let policy = &held.policy;
        if cost == 0 {
            return false;
        }
        let key = [(
            Key::new(&held.slot.mask, subject.as_bytes()),
            held.slot.lifetime_ms,
        )];
        self.store.update_many(
            &key,
            &*self.clock,
            |states, _now| match reserve::charge_spent(policy, states[0], at_ms, cost) {
                Ok(mut s) if s.evaluation.verdict != Verdict::ClockUnsafe => {
                    let written = written(&mut s, policy);
                    let wrote = written.is_some();
                    (written.map(|w| vec![w]), wrote)
                }
                _ => (None, false),
            },
        )
    }

    /// Charges the limits at `charged` together, filling their decisions; the outcome refusing
    /// them all when one cannot be charged.
    fn charge_all(
        &self,
        request: &ChargeRequest,
        policies: &[&RateLimitPolicy],
        keys: &[(Key, u64)],
        charged: &[usize],
        decisions: &mut [Option<RateLimitDecision>],
    ) -> Result<(), ChargeOutcome> {
        if charged.is_empty() {
            return Ok(());
        }
        let their_keys: Vec<(Key, u64)> = charged.iter().map(|&i| keys[i]).collect();
        let result = self
            .store
            .update_many(&their_keys, &*self.clock, |states, now| {
                let mut settlements = Vec::with_capacity(charged.len());
                for (&i, state) in charged.iter().zip(states) {
                    let cost = request.limits[i].cost;
                    match reserve::charge(policies[i], *state, now, cost) {
                        Ok(s) => settlements.push(s),
                        Err(_) => return (None, Err(i)),
                    }
                }
                let unsafe_clock = settlements
                    .iter()
                    .any(|s| s.evaluation.verdict == Verdict::ClockUnsafe);
                let writes = (!unsafe_clock).then(|| {
                    let settled = settlements.iter_mut().zip(charged);
                    settled
                        .filter_map(|(s, &i)| written(s, policies[i]))
                        .collect()
                });
                (writes, Ok(settlements))
            });
        let settlements = result.map_err(|i| incompatible(policies[i]))?;
        for (s, &i) in settlements.iter().zip(charged) {
            match self.decided(policies[i], &s.evaluation) {
                Some(d) => decisions[i] = Some(d),
                None => return Err(clock_unsafe(policies[i], s.evaluation.retry_after_ms)),
            }
        }
        Ok(())
    }
}

fn clock_unsafe(policy: &RateLimitPolicy, retry_after_ms: u64) -> ChargeOutcome {
    Outcome::Unavailable {
        policy_id: policy.id().clone(),
        retry_after_ms,
        category: UnavailableCategory::Clock,
    }
}

fn incompatible(policy: &RateLimitPolicy) -> ChargeOutcome {
    Outcome::Incompatible {
        policy_id: policy.id().clone(),
        category: IncompatibleCategory::State,
    }
}
