//! Reservations on the local store: [`shared_contract::model::reserve`] applied to the limits'
//! states under their keys' locks, and the reservations themselves in one map beside the
//! store.
//!
//! Reserve, settle and cancel run under the map's lock (map first, then the keys' locks, the
//! only order any call takes them in), so retries of one settle racing each other charge once.
//! The map holds at most [`MAX_RESERVATIONS`]; when full, reservations past their forget time
//! are dropped, and a new one is refused rather than one forgotten that a client may still
//! settle. A reservation is kept until one ttl after its expiry.
//!
//! A settlement is computed against the policy as it is now. When a reload removed a policy of
//! the reservation or changed its revision, the state the estimate was charged to is no
//! longer enforced, and the settle answers `Incompatible` (state) for that policy: nothing is
//! charged, and the reservation stays as it was.

use std::collections::HashMap;
use std::convert::Infallible;

use shared_contract::model::multi::{self as multi_model, Settle};
use shared_contract::model::reserve::{Hold, Settlement};
use shared_contract::model::{AlgorithmState, Verdict};
use shared_contract::reservation::{CancelStep, Reservation, SettleStep};
use shared_contract::{
    CancelOutcome, CancelRequest, Cancelled, IncompatibleCategory, Outcome, PolicyId,
    PolicyRevision, RateLimitPolicy, RequestError, ReservationError, ReservationId, ReserveOutcome,
    ReserveRequest, Reserved, SettleOutcome, SettleRequest, Settled, SubjectDigest,
    UnavailableCategory,
};

use crate::LocalProvider;
use crate::store::Key;

/// Most reservations one provider holds.
pub const MAX_RESERVATIONS: usize = 100_000;

/// One reservation: its life, its limits, and the first settlement's answer.
#[derive(Debug)]
struct Record {
    life: Reservation,
    limits: Vec<(PolicyId, PolicyRevision, SubjectDigest)>,
    settled: Option<Settled>,
}

/// Every reservation a provider (and the providers reloaded from it) holds.
#[derive(Debug, Default)]
pub(crate) struct Records {
    map: HashMap<ReservationId, Record>,
}

impl Records {
    /// Room for one more at `now_ms`, dropping forgotten ones when full.
    fn room(&mut self, now_ms: u64) -> Result<(), RequestError> {
        if self.map.len() >= MAX_RESERVATIONS {
            self.map.retain(|_, r| now_ms < r.life.forget_at_ms());
        }
        if self.map.len() >= MAX_RESERVATIONS {
            return Err(RequestError::ReservationsFull {
                held: self.map.len(),
            });
        }
        Ok(())
    }

    /// The reservation `id` names at `now_ms`, forgetting it when its time has come.
    fn live(&mut self, id: &ReservationId, now_ms: u64) -> Option<&mut Record> {
        if self
            .map
            .get(id)
            .is_some_and(|r| now_ms >= r.life.forget_at_ms())
        {
            self.map.remove(id);
        }
        self.map.get_mut(id)
    }
}

/// A failure as the outcome of any answer type.
fn failed<U>(failure: Outcome<Infallible>) -> Outcome<U> {
    match failure.decided() {
        Ok(never) => match never {},
        Err(failure) => failure,
    }
}

/// What settlement `s` of `policy` writes, taken out of it: the state and how long it lives
/// (the model's ttl, since an overdraft may outlive the policy's usual horizon, plus the
/// clock's tolerance, as every entry's).
pub(crate) fn written(
    s: &mut Settlement<AlgorithmState>,
    policy: &RateLimitPolicy,
) -> Option<(AlgorithmState, u64)> {
    let lifetime = s
        .evaluation
        .ttl_ms
        .saturating_add(policy.max_clock_regression_ms());
    s.evaluation.new_state.take().map(|state| (state, lifetime))
}

/// How a settlement of a record's limits went.
enum Charged {
    Done(Vec<Settlement<AlgorithmState>>),
    Failed(Outcome<Infallible>),
}

impl LocalProvider {
    /// Reserves now, without an executor (see [`shared_contract::EdgeRateLimitPort::reserve`]).
    ///
    /// # Errors
    /// As [`shared_contract::PolicySet::admit_reservation`], and
    /// [`RequestError::ReservationsFull`]; nothing is reserved.
    pub fn reserve_now(&self, request: &ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        let policies = self.policies.admit_reservation(request)?;
        let keys = self.keys_of(
            request
                .limits
                .iter()
                .zip(&policies)
                .map(|(l, p)| (*p, l.subject)),
        )?;
        let mut records = self.reservations.lock();
        records.room(self.clock.now_ms())?;
        let (evaluation, holds, now) =
            self.store.update_many(&keys, &*self.clock, |states, now| {
                let members = crate::members(&policies, states, &request.limits);
                match multi_model::reserve_all(&members, now) {
                    Ok((mut e, holds)) => {
                        let writes = holds.as_ref().map(|_| {
                            let states = e.members.iter_mut().filter_map(|m| m.new_state.take());
                            states.map(|s| (s, 0)).collect()
                        });
                        (writes, (Ok(e), holds, now))
                    }
                    Err(err) => (None, (Err(err), None, now)),
                }
            });
        let decision = match self.multi_outcome(&policies, evaluation).decided() {
            Ok(decision) => decision,
            Err(failure) => return Ok(failure),
        };
        let Some(holds) = holds else {
            let reserved = Reserved {
                decision,
                id: None,
                expires_in_ms: 0,
            };
            return Ok(Outcome::Evaluated(reserved));
        };
        let id = ReservationId {
            subject: request.limits.as_slice()[0].subject,
            token: self.tokens.next_token(),
        };
        let limits = request
            .limits
            .iter()
            .zip(&policies)
            .map(|(l, p)| (p.id().clone(), p.revision(), l.subject))
            .collect();
        let record = Record {
            life: Reservation::new(holds, now, request.ttl),
            limits,
            settled: None,
        };
        records.map.insert(id, record);
        Ok(Outcome::Evaluated(Reserved {
            decision,
            id: Some(id),
            expires_in_ms: request.ttl.as_millis(),
        }))
    }

    /// Settles now, without an executor (see [`shared_contract::EdgeRateLimitPort::settle`]).
    ///
    /// # Errors
    /// None today; the signature is the port's.
    pub fn settle_now(&self, request: &SettleRequest) -> Result<SettleOutcome, RequestError> {
        let mut records = self.reservations.lock();
        let now = self.clock.now_ms();
        let Some(record) = records.live(&request.id, now) else {
            return Ok(Outcome::Evaluated(Err(ReservationError::Unknown)));
        };
        match record.life.settle_step(now, &request.actual) {
            Err(e) => return Ok(Outcome::Evaluated(Err(e))),
            Ok(SettleStep::Replay) => {
                let mut first = record
                    .settled
                    .clone()
                    .expect("a settled record keeps its answer");
                first.replayed = true;
                return Ok(Outcome::Evaluated(Ok(first)));
            }
            Ok(SettleStep::Charge) => {}
        }
        let policies = match self.policies_of(record) {
            Ok(p) => p,
            Err(failure) => return Ok(failed(failure)),
        };
        for (index, (p, &actual)) in policies.iter().zip(&request.actual).enumerate() {
            let max_cost = p.max_cost().get();
            if actual > max_cost {
                let e = ReservationError::ActualAboveMax {
                    index,
                    actual,
                    max_cost,
                };
                return Ok(Outcome::Evaluated(Err(e)));
            }
        }
        let settlements = match self.charge(record, &policies, &request.actual)? {
            Charged::Done(s) => s,
            Charged::Failed(failure) => return Ok(failed(failure)),
        };
        let decisions = settlements
            .iter()
            .zip(&policies)
            .filter_map(|(s, p)| self.decided(p, &s.evaluation))
            .collect();
        let settled = Settled {
            charged: request.actual.clone(),
            decisions,
            replayed: false,
        };
        record.life.settled(request.actual.clone());
        record.settled = Some(settled.clone());
        Ok(Outcome::Evaluated(Ok(settled)))
    }

    /// Cancels now, without an executor (see [`shared_contract::EdgeRateLimitPort::cancel`]).
    ///
    /// # Errors
    /// None today; the signature is the port's.
    pub fn cancel_now(&self, request: &CancelRequest) -> Result<CancelOutcome, RequestError> {
        let mut records = self.reservations.lock();
        let now = self.clock.now_ms();
        let Some(record) = records.live(&request.id, now) else {
            return Ok(Outcome::Evaluated(Err(ReservationError::Unknown)));
        };
        match record.life.cancel_step(now) {
            Err(e) => return Ok(Outcome::Evaluated(Err(e))),
            Ok(CancelStep::Replay) => {
                return Ok(Outcome::Evaluated(Ok(Cancelled { replayed: true })));
            }
            Ok(CancelStep::Refund) => {}
        }
        let policies = match self.policies_of(record) {
            Ok(p) => p,
            Err(failure) => return Ok(failed(failure)),
        };
        let nothing = vec![0; policies.len()];
        if let Charged::Failed(failure) = self.charge(record, &policies, &nothing)? {
            return Ok(failed(failure));
        }
        record.life.cancelled();
        Ok(Outcome::Evaluated(Ok(Cancelled { replayed: false })))
    }

    /// The store key and entry lifetime of each `(policy, subject)`.
    pub(crate) fn keys_of<'a>(
        &self,
        limits: impl Iterator<Item = (&'a RateLimitPolicy, SubjectDigest)>,
    ) -> Result<Vec<(Key, u64)>, RequestError> {
        limits
            .map(|(p, subject)| {
                // Every policy of the set got a slot at construction.
                let slot = self
                    .slots
                    .get(p.id())
                    .ok_or_else(|| RequestError::UnknownPolicy(p.id().clone()))?
                    .slot;
                Ok((Key::new(&slot.mask, subject.as_bytes()), slot.lifetime_ms))
            })
            .collect()
    }

    /// The record's policies as enforced now; a policy removed or at another revision since
    /// the reservation is incompatible state.
    fn policies_of(&self, record: &Record) -> Result<Vec<&RateLimitPolicy>, Outcome<Infallible>> {
        record
            .limits
            .iter()
            .map(|(id, revision, _)| {
                self.policies
                    .get(id)
                    .filter(|p| p.revision() == *revision)
                    .ok_or_else(|| Outcome::Incompatible {
                        policy_id: id.clone(),
                        category: IncompatibleCategory::State,
                    })
            })
            .collect()
    }

    /// Settles every hold of `record` with `actual`, all or nothing.
    fn charge(
        &self,
        record: &Record,
        policies: &[&RateLimitPolicy],
        actual: &[u64],
    ) -> Result<Charged, RequestError> {
        let keys = self.keys_of(
            policies
                .iter()
                .zip(&record.limits)
                .map(|(p, (_, _, subject))| (*p, *subject)),
        )?;
        let holds: &[Hold] = record.life.holds();
        let result = self.store.update_many(&keys, &*self.clock, |states, now| {
            let members: Vec<Settle<'_>> = policies
                .iter()
                .zip(states)
                .zip(holds.iter().zip(actual))
                .map(|((policy, state), (hold, &actual))| Settle {
                    policy,
                    state: *state,
                    hold,
                    actual,
                })
                .collect();
            match multi_model::settle_all(&members, now) {
                Ok(mut settlements) => {
                    let writes = settlements
                        .iter_mut()
                        .zip(policies)
                        .map(|(s, p)| written(s, p))
                        .collect();
                    (writes, Ok(settlements))
                }
                Err(e) => (None, Err(e)),
            }
        });
        Ok(match result {
            Ok(settlements) => {
                match settlements
                    .iter()
                    .position(|s| s.evaluation.verdict == Verdict::ClockUnsafe)
                {
                    Some(index) => Charged::Failed(Outcome::Unavailable {
                        policy_id: policies[index].id().clone(),
                        retry_after_ms: settlements[index].evaluation.retry_after_ms,
                        category: UnavailableCategory::Clock,
                    }),
                    None => Charged::Done(settlements),
                }
            }
            Err(e) => Charged::Failed(Outcome::Incompatible {
                policy_id: policies[e.index].id().clone(),
                category: IncompatibleCategory::State,
            }),
        })
    }
}
