//! A policy's plan: what each of its requests needs, computed once (its program, key hashes,
//! packed arguments and clock metrics), and the single program's call.

use std::time::Duration;

use redis::Value;
use shared_contract::RateLimitPolicy;

use crate::error::Error;
use crate::failure::Failure;
use crate::keys::PolicyKeys;
use crate::pool::{Pool, ScriptReply};
use crate::programs::{self, Program};
use crate::reply;
use crate::resp;
use crate::script::ScriptArgs;
use crate::telemetry::ClockMetrics;

/// What a decision's call gets back: the program's reply (for a batch member: its row), with
/// the call's replica acknowledgements; or why the call failed.
pub(crate) type Answer = Result<ScriptReply, Failure>;

/// Everything one policy needs per request, computed once.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) program: &'static Program,
    /// The algorithm's code in the multi and batch programs' arguments.
    pub(crate) code: u64,
    pub(crate) keys: PolicyKeys,
    /// `ARGV[1]` after the cost: the policy's packed fields.
    packed: Vec<u8>,
    /// The RESP bulk header of `ARGV[1]` (`$<len>\r\n`), whose length the cost never changes.
    bulk_header: Vec<u8>,
    /// The policy's clock metrics, fed by every reply of its member.
    pub(crate) clock: ClockMetrics,
}

impl Plan {
    pub(crate) fn new(prefix: &str, policy: &RateLimitPolicy) -> Result<Self, Error> {
        let packed = programs::arguments(policy);
        let bulk_header = format!("${}\r\n", programs::COST_WIDTH + packed.len()).into_bytes();
        Ok(Self {
            program: programs::program(policy.kind()),
            code: programs::algorithm_code(policy.kind()),
            keys: PolicyKeys::new(prefix, policy)?,
            packed,
            bulk_header,
            clock: ClockMetrics::new(policy.id()),
        })
    }

    /// Runs the single program for `cost` on `key` (of `slot`).
    pub(crate) async fn run(
        &self,
        pool: &Pool,
        slot: u16,
        key: &str,
        cost: u64,
        timeout: Duration,
    ) -> Answer {
        let call = Evaluation {
            plan: self,
            key,
            cost,
        };
        pool.run_script(&self.program.script, slot, &call, timeout)
            .await
    }

    /// Appends `ARGV[1]` for `cost` as one RESP bulk string: the cost, then the fields.
    pub(crate) fn write_arguments(&self, out: &mut Vec<u8>, cost: u64) {
        out.extend_from_slice(&self.bulk_header);
        out.extend_from_slice(&programs::pack_cost(cost));
        out.extend_from_slice(&self.packed);
        out.extend_from_slice(b"\r\n");
    }
}

impl Plan {
    /// Appends a settlement member's arguments (`lua/rate-settle-v1.lua`) as one RESP bulk
    /// string: `actual` in the cost's place, the fields, then the hold.
    pub(crate) fn write_settle_arguments(
        &self,
        out: &mut Vec<u8>,
        actual: u64,
        estimate: u64,
        at_ms: u64,
    ) {
        let mut bytes = Vec::with_capacity(programs::COST_WIDTH + self.packed.len() + 13);
        bytes.extend_from_slice(&programs::pack_cost(actual));
        bytes.extend_from_slice(&self.packed);
        bytes.extend_from_slice(&programs::settle_hold(estimate, at_ms));
        resp::write_bulk(out, &bytes);
    }
}

/// One evaluation's program call: `1 key packed-arguments` after `EVALSHA sha1`.
struct Evaluation<'a> {
    plan: &'a Plan,
    key: &'a str,
    cost: u64,
}

impl ScriptArgs for Evaluation<'_> {
    fn count(&self) -> usize {
        3
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"$1\r\n1\r\n");
        resp::write_bulk(out, self.key.as_bytes());
        self.plan.write_arguments(out, self.cost);
    }

    /// Only an allow consumed quota; a denial wrote nothing worth waiting for.
    fn needs_ack(&self, reply: &Value) -> bool {
        reply::is_allowed(reply)
    }
}
