//! Checks and charges after the work on Redis ([`shared_contract::EdgeRateLimitPort::charge`]):
//! one call of the settlement program (`lua/rate-settle-v1.lua`) for the whole request. A
//! check is a read-only evaluation of a cost of 1; a charge is a settlement of a hold of
//! nothing, past the limit if need be (into an overdraft). The charges are written together,
//! or none of them (a clock unsafe for any member, an incompatible state).

use redis::Value;
use shared_contract::{ChargeOutcome, ChargeRequest, EdgeRateLimitPort, RequestError};

use crate::plan::Plan;
use crate::programs;
use crate::provider::RedisProvider;
use crate::reply;
use crate::resp;
use crate::script::ScriptArgs;

/// What the settlement program does with one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Evaluates a cost of 1 and writes nothing.
    Check,
    /// Settles a hold of `estimate` charged at `at_ms` with the `actual` cost.
    Settle {
        actual: u64,
        estimate: u64,
        at_ms: u64,
    },
}

/// One settlement program call: `n keys... header (operation code arguments)...` after
/// `EVALSHA sha1`.
pub(crate) struct SettleCall<'a> {
    /// Each member's plan, state key and operation.
    pub(crate) members: Vec<(&'a Plan, String, Operation)>,
}

impl ScriptArgs for SettleCall<'_> {
    fn count(&self) -> usize {
        1 + self.members.len() + 1 + 3 * self.members.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        resp::write_bulk_u64(out, self.members.len() as u64);
        for (_, key, _) in &self.members {
            resp::write_bulk(out, key.as_bytes());
        }
        // At most 8 members (the request's bound), so the count fits its byte; operation 0,
        // a charge.
        resp::write_bulk(out, &[self.members.len() as u8, 0]);
        for (plan, _, operation) in &self.members {
            match *operation {
                Operation::Check => {
                    resp::write_bulk(out, b"check");
                    resp::write_bulk_u64(out, plan.code);
                    plan.write_arguments(out, 1);
                }
                Operation::Settle {
                    actual,
                    estimate,
                    at_ms,
                } => {
                    resp::write_bulk(out, b"settle");
                    resp::write_bulk_u64(out, plan.code);
                    plan.write_settle_arguments(out, actual, estimate, at_ms);
                }
            }
        }
    }

    /// A settlement is written whenever the call decided (allowed or denied by a check).
    fn needs_ack(&self, reply: &Value) -> bool {
        let settles = self
            .members
            .iter()
            .any(|(_, _, o)| matches!(o, Operation::Settle { .. }));
        settles && reply::is_decision(reply)
    }
}

impl RedisProvider {
    /// [`shared_contract::EdgeRateLimitPort::charge`] on Redis.
    pub(crate) async fn charge_all(
        &self,
        request: ChargeRequest,
    ) -> Result<ChargeOutcome, RequestError> {
        let policies = self.policies().admit_charge(&request)?;
        let mut members = Vec::with_capacity(policies.len());
        for (limit, policy) in request.limits.iter().zip(&policies) {
            let plan = self.plan(policy)?;
            let operation = match limit.cost {
                0 => Operation::Check,
                actual => Operation::Settle {
                    actual,
                    estimate: 0,
                    // A hold of nothing refunds nothing: its time is never read.
                    at_ms: 0,
                },
            };
            members.push((plan, plan.keys.state_key(&limit.subject), operation));
        }
        let slot = self.one_slot(members.iter().map(|(_, key, _)| key.as_str()))?;
        let call = SettleCall { members };
        let plans = call.members.iter().map(|(plan, _, _)| *plan);
        let called = self.call_members(
            &programs::SETTLE,
            &call,
            slot,
            plans,
            &policies,
            request.deadline,
        );
        Ok(called.await.unwrap_or_else(|failed| failed))
    }
}
