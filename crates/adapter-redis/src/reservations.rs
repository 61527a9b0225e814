//! Reservations on Redis ([`shared_contract::EdgeRateLimitPort::reserve`], `settle`,
//! `cancel`): the settlement program's reserve, settle and cancel operations
//! (`lua/rate-settle-v1.lua`), the reservation's record kept beside the first limit's state
//! (`keys::reservation_key`, the same slot).
//!
//! - Reserve is one call: the estimates evaluated all or nothing and, when admitted, the
//!   record written with them (its holds, expiry, and which limits it holds: the blob).
//! - Settle and cancel read the record first (`GET`: which limits, so that the call can name
//!   their keys), then make one call that settles the record's holds and ends it, once. The
//!   program checks the record again, so a race with another settle or cancel, or the
//!   record's expiry, is decided atomically there.
//!
//! A settlement is computed against the policies as they are now. When a reload removed a
//! policy of the reservation or changed its revision, its state is no longer enforced: the
//! settle answers `Incompatible` (state) for that policy, and nothing is charged.

use redis::Value;
use shared_contract::{
    CancelOutcome, CancelRequest, Cancelled, EdgeRateLimitPort, IncompatibleCategory,
    MultiDecision, MultiOutcome, Outcome, PolicyId, PolicyRevision, RateLimitPolicy, RequestError,
    ReservationError, ReservationId, ReserveOutcome, ReserveRequest, Reserved, SettleOutcome,
    SettleRequest, Settled, SubjectDigest,
};

use crate::failure::Failure;
use crate::keys::{hash_slot, reservation_key};
use crate::plan::Plan;
use crate::programs;
use crate::provider::RedisProvider;
use crate::reply::{self, Reply, Status};
use crate::resp;
use crate::script::ScriptArgs;

/// The record's tag byte.
const TAG: u8 = 0x52;
/// Header, then 13 bytes per hold.
const HEADER: usize = 13;
const HOLD: usize = 13;
/// A settled record's result per member: the actual cost and six row numbers.
const RESULT: usize = 49;

/// How a record stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standing {
    Outstanding,
    /// Settled with these actual costs and rows.
    Settled(Vec<(u64, Reply)>),
    Cancelled,
}

/// A reservation's record, as the settlement program writes it (`docs/lua-programs.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) standing: Standing,
    pub(crate) expires_at_ms: u64,
    /// Each limit's policy, revision and subject, in request order.
    pub(crate) limits: Vec<(PolicyId, PolicyRevision, SubjectDigest)>,
}

/// Little-endian unsigned integer of `bytes`.
fn le(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

/// The blob a reservation keeps: per limit its revision (4 bytes), subject (32) and policy
/// id (its length, 1 byte, then the id).
fn blob(limits: &[(&RateLimitPolicy, SubjectDigest)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (policy, subject) in limits {
        out.extend_from_slice(&policy.revision().get().to_le_bytes());
        out.extend_from_slice(subject.as_bytes());
        let id = policy.id().as_str().as_bytes();
        // A policy id is at most 64 bytes.
        out.push(id.len() as u8);
        out.extend_from_slice(id);
    }
    out
}

impl Record {
    /// Reads a record strictly; `None` for anything the program did not write.
    pub(crate) fn parse(b: &[u8]) -> Option<Record> {
        let header = b.get(..HEADER)?;
        let (status, n) = (header[1], usize::from(header[12]));
        if header[0] != TAG || !(1..=8).contains(&n) {
            return None;
        }
        let expires_at_ms = le(&header[2..8]);
        let at = HEADER + HOLD * n;
        let len = usize::try_from(le(b.get(at..at + 2)?)).ok()?;
        let mut rest = b.get(at + 2..at + 2 + len)?;
        let mut limits = Vec::with_capacity(n);
        for _ in 0..n {
            let revision = u32::try_from(le(rest.get(..4)?)).ok()?;
            let subject: [u8; 32] = rest.get(4..36)?.try_into().ok()?;
            let id_len = usize::from(*rest.get(36)?);
            let id = std::str::from_utf8(rest.get(37..37 + id_len)?).ok()?;
            limits.push((
                PolicyId::new(id).ok()?,
                PolicyRevision::new(revision).ok()?,
                SubjectDigest::from_bytes(subject),
            ));
            rest = &rest[37 + id_len..];
        }
        if !rest.is_empty() {
            return None;
        }
        let results = &b[at + 2 + len..];
        let standing = match status {
            0 | 2 if !results.is_empty() => return None,
            0 => Standing::Outstanding,
            2 => Standing::Cancelled,
            1 if results.len() == RESULT * n => Standing::Settled(
                results
                    .chunks(RESULT)
                    .map(|r| {
                        let f = |i: usize| le(&r[7 * i..7 * i + 7]);
                        let row = Reply {
                            status: Status::Allowed,
                            server_now_ms: f(1),
                            effective_now_ms: f(2),
                            limit: f(3),
                            remaining: f(4),
                            retry_after_ms: f(5),
                            reset_at_ms: f(6),
                        };
                        (f(0), row)
                    })
                    .collect(),
            ),
            _ => return None,
        };
        Some(Record {
            standing,
            expires_at_ms,
            limits,
        })
    }
}

/// A reserve call: `n+1 keys... header ttl blob (code arguments)...`.
struct ReserveCall<'a> {
    members: Vec<(&'a Plan, String, u64)>,
    record: String,
    ttl_ms: u64,
    blob: Vec<u8>,
}

impl ScriptArgs for ReserveCall<'_> {
    fn count(&self) -> usize {
        1 + self.members.len() + 1 + 3 + 2 * self.members.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        resp::write_bulk_u64(out, self.members.len() as u64 + 1);
        for (_, key, _) in &self.members {
            resp::write_bulk(out, key.as_bytes());
        }
        resp::write_bulk(out, self.record.as_bytes());
        resp::write_bulk(out, &[self.members.len() as u8, 1]);
        // A ttl is at most a day: it fits 4 bytes.
        resp::write_bulk(out, &(self.ttl_ms as u32).to_le_bytes());
        resp::write_bulk(out, &self.blob);
        for (plan, _, estimate) in &self.members {
            resp::write_bulk_u64(out, plan.code);
            plan.write_arguments(out, *estimate);
        }
    }

    /// The states and the record are written only when every member admitted.
    fn needs_ack(&self, reply: &Value) -> bool {
        reply::is_allowed(reply)
    }
}

/// A settle or cancel call: `n+1 keys... header (code arguments)...`.
struct EndCall<'a> {
    members: Vec<(&'a Plan, String, u64)>,
    record: String,
    cancel: bool,
}

impl ScriptArgs for EndCall<'_> {
    fn count(&self) -> usize {
        1 + self.members.len() + 1 + 1 + 2 * self.members.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        resp::write_bulk_u64(out, self.members.len() as u64 + 1);
        for (_, key, _) in &self.members {
            resp::write_bulk(out, key.as_bytes());
        }
        resp::write_bulk(out, self.record.as_bytes());
        let op = if self.cancel { 3 } else { 2 };
        resp::write_bulk(out, &[self.members.len() as u8, op]);
        for (plan, _, actual) in &self.members {
            resp::write_bulk_u64(out, plan.code);
            plan.write_arguments(out, *actual);
        }
    }

    /// Every settlement and the record are written exactly when the reply is `ALLOWED`.
    fn needs_ack(&self, reply: &Value) -> bool {
        reply::is_allowed(reply)
    }
}

/// What the program's settle and cancel answer, instead of rows, about a record that is
/// not outstanding (any longer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// `UNKNOWN`: gone (never made, or forgotten one ttl after its expiry).
    Unknown,
    /// `SETTLED`: settled first.
    Settled,
    /// `CANCELLED`: cancelled first.
    Cancelled,
    /// `EXPIRED`: its ttl ended unsettled.
    Expired,
}

impl Ended {
    /// The record status a reply carries, if it is one.
    fn of(value: &Value) -> Option<Ended> {
        let Value::Array(fields) = value else {
            return None;
        };
        let Some(Value::BulkString(status)) = fields.first() else {
            return None;
        };
        Some(match status.as_slice() {
            b"UNKNOWN" => Ended::Unknown,
            b"SETTLED" => Ended::Settled,
            b"CANCELLED" => Ended::Cancelled,
            b"EXPIRED" => Ended::Expired,
            _ => return None,
        })
    }

    /// What it refuses (`record` says when it expired).
    fn refusal(self, record: &Record) -> ReservationError {
        match self {
            Ended::Unknown => ReservationError::Unknown,
            Ended::Settled => ReservationError::Settled,
            Ended::Cancelled => ReservationError::Cancelled,
            Ended::Expired => ReservationError::Expired {
                expired_at_ms: record.expires_at_ms,
            },
        }
    }
}

/// What an evaluated reservation answers: with its id when admitted.
fn reserved(decision: MultiDecision, id: ReservationId, ttl_ms: u64) -> Reserved {
    let admitted = decision.allowed;
    Reserved {
        decision,
        id: admitted.then_some(id),
        expires_in_ms: if admitted { ttl_ms } else { 0 },
    }
}

/// A record's limits with the policies they name now: `Incompatible` (state) of the first
/// limit whose policy is gone or has another revision.
fn current<'p, U>(
    record: &Record,
    policies: &'p shared_contract::PolicySet,
) -> Result<Vec<&'p RateLimitPolicy>, Outcome<U>> {
    record
        .limits
        .iter()
        .map(|(id, revision, _)| {
            policies
                .get(id)
                .filter(|p| p.revision() == *revision)
                .ok_or_else(|| Outcome::Incompatible {
                    policy_id: id.clone(),
                    category: IncompatibleCategory::State,
                })
        })
        .collect()
}

/// The first answer of a settled reservation, again.
fn replay(results: &[(u64, Reply)], policies: &[&RateLimitPolicy]) -> Option<Settled> {
    let mut decisions = Vec::with_capacity(results.len());
    for ((_, row), policy) in results.iter().zip(policies) {
        match reply::decide(row, policy).ok()? {
            Outcome::Evaluated(d) => decisions.push(d),
            _ => return None,
        }
    }
    Some(Settled {
        charged: results.iter().map(|(actual, _)| *actual).collect(),
        decisions,
        replayed: true,
    })
}

impl RedisProvider {
    /// [`shared_contract::EdgeRateLimitPort::reserve`] on Redis.
    pub(crate) async fn reserve_limits(
        &self,
        request: ReserveRequest,
    ) -> Result<ReserveOutcome, RequestError> {
        let policies = self.policies().admit_reservation(&request)?;
        let limits = request.limits.as_slice();
        let mut members = Vec::with_capacity(policies.len());
        for (limit, policy) in limits.iter().zip(&policies) {
            let plan = self.plan(policy)?;
            members.push((plan, plan.keys.state_key(&limit.subject), limit.cost.get()));
        }
        let id = ReservationId {
            subject: limits[0].subject,
            token: self.tokens().next_token(),
        };
        let record = reservation_key(&self.settings().key_prefix, &id);
        let keys = members.iter().map(|(_, k, _)| k.as_str());
        let slot = self.one_slot(keys.chain([record.as_str()]))?;
        let held: Vec<_> = limits
            .iter()
            .zip(&policies)
            .map(|(l, p)| (*p, l.subject))
            .collect();
        let ttl_ms = request.ttl.as_millis();
        let call = ReserveCall {
            members,
            record,
            ttl_ms,
            blob: blob(&held),
        };
        let plans = call.members.iter().map(|(plan, _, _)| *plan);
        let called = self.call_members(
            &programs::SETTLE,
            &call,
            slot,
            plans,
            &policies,
            request.deadline,
        );
        let outcome = match called.await {
            Ok(outcome) => outcome,
            Err(failed) => return Ok(failed),
        };
        Ok(match outcome.decided() {
            Ok(decision) => Outcome::Evaluated(reserved(decision, id, ttl_ms)),
            Err(failure) => failure,
        })
    }

    /// The record of reservation `id` (its key, slot and what it holds); `Ok(None)` when
    /// there is none.
    async fn record<U>(
        &self,
        id: &ReservationId,
        deadline: shared_contract::Deadline,
    ) -> Result<(String, u16, Option<Record>), Outcome<U>> {
        let key = reservation_key(&self.settings().key_prefix, id);
        let slot = hash_slot(key.as_bytes());
        let policies = self.policies();
        // Which policy a failure names before the record says: the default one.
        let named = policies
            .get(policies.default_id())
            .ok_or(Outcome::Incompatible {
                policy_id: policies.default_id().clone(),
                category: IncompatibleCategory::Program,
            })?;
        let timeout = self.settings().command_timeout;
        let _permit = self
            .pool()
            .admit(deadline, timeout)
            .map_err(|category| self.failed(named, Failure::Unavailable(category)))?;
        let cmd = redis::cmd("GET").arg(&key).clone();
        let value = self
            .pool()
            .run_command(&cmd, slot, timeout)
            .await
            .map_err(|failure| self.failed(named, failure))?;
        let record = match value {
            Value::Nil => None,
            Value::BulkString(b) => Some(Record::parse(&b).ok_or(Outcome::Incompatible {
                policy_id: named.id().clone(),
                category: IncompatibleCategory::State,
            })?),
            _ => {
                return Err(Outcome::Incompatible {
                    policy_id: named.id().clone(),
                    category: IncompatibleCategory::State,
                });
            }
        };
        Ok((key, slot, record))
    }

    /// One settle or cancel call of `record` (at `key`, on `slot`) with `actual` per limit:
    /// the decision, or the record's status when it had ended, expired or vanished meanwhile.
    /// The record's limits share its slot: the reservation was refused otherwise
    /// (`SpansSlots`).
    async fn end_call<U>(
        &self,
        (record, key, slot): (&Record, String, u16),
        policies: &[&RateLimitPolicy],
        actual: &[u64],
        (cancel, deadline): (bool, shared_contract::Deadline),
    ) -> Result<Result<MultiDecision, Ended>, Outcome<U>> {
        let mut members = Vec::with_capacity(policies.len());
        for ((policy, (_, _, subject)), &actual) in policies.iter().zip(&record.limits).zip(actual)
        {
            let plan = self.plan(policy).map_err(|_| Outcome::Incompatible {
                policy_id: policy.id().clone(),
                category: IncompatibleCategory::State,
            })?;
            members.push((plan, plan.keys.state_key(subject), actual));
        }
        let call = EndCall {
            members,
            record: key,
            cancel,
        };
        let reply = self
            .run_members(&programs::SETTLE, &call, slot, policies[0], deadline)
            .await?;
        if let Some(ended) = Ended::of(&reply.value) {
            return Ok(Err(ended));
        }
        let plans = call.members.iter().map(|(plan, _, _)| *plan);
        let outcome = self.read_members(&reply, plans, policies);
        let wrote = matches!(outcome, MultiOutcome::Evaluated(_)) && call.needs_ack(&reply.value);
        if wrote {
            // A refund frees what a cached denial proved was used: this instance forgets
            // it (another instance's entry lasts until its retry time, denying, never
            // admitting, more).
            for (policy, (_, _, subject)) in policies.iter().zip(&record.limits) {
                self.deny_cache().forget(policy, subject);
            }
        }
        let outcome = self.acknowledged(outcome, wrote, &reply, &programs::SETTLE, policies[0]);
        outcome.decided().map(Ok)
    }

    /// [`shared_contract::EdgeRateLimitPort::settle`] on Redis.
    pub(crate) async fn settle_reservation(
        &self,
        request: SettleRequest,
    ) -> Result<SettleOutcome, RequestError> {
        let (key, slot, record) = match self.record(&request.id, request.deadline).await {
            Ok(found) => found,
            Err(failed) => return Ok(failed),
        };
        let Some(record) = record else {
            return Ok(Outcome::Evaluated(Err(ReservationError::Unknown)));
        };
        let policies = match current(&record, self.policies()) {
            Ok(policies) => policies,
            Err(failed) => return Ok(failed),
        };
        match &record.standing {
            Standing::Settled(results) => return Ok(replayed(results, &policies)),
            Standing::Cancelled => return Ok(Outcome::Evaluated(Err(ReservationError::Cancelled))),
            Standing::Outstanding => {}
        }
        if request.actual.len() != policies.len() {
            return Ok(Outcome::Evaluated(Err(ReservationError::ActualCount {
                expected: policies.len(),
                got: request.actual.len(),
            })));
        }
        for (index, (policy, &actual)) in policies.iter().zip(&request.actual).enumerate() {
            let max_cost = policy.max_cost().get();
            if actual > max_cost {
                return Ok(Outcome::Evaluated(Err(ReservationError::ActualAboveMax {
                    index,
                    actual,
                    max_cost,
                })));
            }
        }
        let ended = self
            .end_call(
                (&record, key, slot),
                &policies,
                &request.actual,
                (false, request.deadline),
            )
            .await;
        Ok(match ended {
            Ok(Ok(decision)) => Outcome::Evaluated(Ok(Settled {
                charged: request.actual,
                decisions: decision.decisions,
                replayed: false,
            })),
            // A racing settle won: answer its result.
            Ok(Err(Ended::Settled)) => match self.record(&request.id, request.deadline).await {
                Ok((
                    _,
                    _,
                    Some(Record {
                        standing: Standing::Settled(results),
                        ..
                    }),
                )) => replayed(&results, &policies),
                Ok(_) => state_incompatible(policies[0]),
                Err(failed) => failed,
            },
            Ok(Err(ended)) => Outcome::Evaluated(Err(ended.refusal(&record))),
            Err(failed) => failed,
        })
    }

    /// [`shared_contract::EdgeRateLimitPort::cancel`] on Redis.
    pub(crate) async fn cancel_reservation(
        &self,
        request: CancelRequest,
    ) -> Result<CancelOutcome, RequestError> {
        let (key, slot, record) = match self.record(&request.id, request.deadline).await {
            Ok(found) => found,
            Err(failed) => return Ok(failed),
        };
        let Some(record) = record else {
            return Ok(Outcome::Evaluated(Err(ReservationError::Unknown)));
        };
        match &record.standing {
            Standing::Settled(_) => return Ok(Outcome::Evaluated(Err(ReservationError::Settled))),
            Standing::Cancelled => return Ok(Outcome::Evaluated(Ok(Cancelled { replayed: true }))),
            Standing::Outstanding => {}
        }
        let policies = match current(&record, self.policies()) {
            Ok(policies) => policies,
            Err(failed) => return Ok(failed),
        };
        let nothing = vec![0; policies.len()];
        let ended = self
            .end_call(
                (&record, key, slot),
                &policies,
                &nothing,
                (true, request.deadline),
            )
            .await;
        Ok(match ended {
            Ok(Ok(_)) => Outcome::Evaluated(Ok(Cancelled { replayed: false })),
            Ok(Err(Ended::Cancelled)) => Outcome::Evaluated(Ok(Cancelled { replayed: true })),
            Ok(Err(ended)) => Outcome::Evaluated(Err(ended.refusal(&record))),
            Err(failed) => failed,
        })
    }
}

fn state_incompatible<T>(policy: &RateLimitPolicy) -> Outcome<T> {
    Outcome::Incompatible {
        policy_id: policy.id().clone(),
        category: IncompatibleCategory::State,
    }
}

/// A settled reservation's first answer, again (`Incompatible` (state) when its rows no
/// longer fit the policies).
fn replayed(results: &[(u64, Reply)], policies: &[&RateLimitPolicy]) -> SettleOutcome {
    match replay(results, policies) {
        Some(settled) => Outcome::Evaluated(Ok(settled)),
        None => state_incompatible(policies[0]),
    }
}
