//! A policy's plan: what each of its requests needs, computed once (its program, key hashes,
//! packed arguments and clock metrics), and the single program's call.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use shared_contract::policy::calendar::Calendar;
use shared_contract::{Algorithm, RateLimitPolicy};

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
    /// A fixed window of calendar periods: its calendar, and the bounds last sent.
    calendar: Option<(Calendar, Mutex<[u64; 4]>)>,
}

/// This machine's clock, Unix ms. Calendar bounds only need to hold Redis's `TIME` (the
/// program picks the period holding it among the previous, current and next), so a clock
/// within a period of Redis's is enough.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The previous, current and next period of `calendar` around `t`: `[b0, b1)`, `[b1, b2)`,
/// `[b2, b3)`; `None` where the calendar places no period (before 1970, after 9999).
pub(crate) fn calendar_bounds(calendar: &Calendar, t: u64) -> Option<[u64; 4]> {
    let (start, end) = calendar.bounds(t)?;
    let (previous, _) = calendar.bounds(start.checked_sub(1)?)?;
    let (_, next) = calendar.bounds(end)?;
    Some([previous, start, end, next])
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
            calendar: match policy.algorithm() {
                Algorithm::FixedWindow(w) => w.calendar().map(|c| (c, Mutex::new([0; 4]))),
                _ => None,
            },
        })
    }

    /// The calendar bounds around this machine's clock, packed (24 bytes): `None` for an
    /// epoch-aligned policy; one byte for a clock the calendar cannot place, which makes the
    /// arguments a length the program refuses (`INVALID`) rather than count epoch windows.
    fn bounds(&self) -> Option<([u8; 24], usize)> {
        let (calendar, last) = self.calendar.as_ref()?;
        let now = wall_ms();
        let mut last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !(last[1]..last[2]).contains(&now) {
            match calendar_bounds(calendar, now) {
                Some(bounds) => *last = bounds,
                None => return Some(([0; 24], 1)),
            }
        }
        let mut out = [0; 24];
        for (chunk, b) in out.chunks_mut(6).zip(last.iter()) {
            chunk.copy_from_slice(&b.to_le_bytes()[..6]);
        }
        Some((out, 24))
    }

    /// Appends one RESP bulk string: `cost`, the packed fields, a calendar window's bounds,
    /// and `tail` (a settlement's hold).
    fn write_fields(&self, out: &mut Vec<u8>, cost: u64, tail: &[u8]) {
        let bounds = self.bounds();
        if bounds.is_none() && tail.is_empty() {
            out.extend_from_slice(&self.bulk_header);
        } else {
            let len = programs::COST_WIDTH
                + self.packed.len()
                + bounds.as_ref().map_or(0, |(_, n)| *n)
                + tail.len();
            out.push(b'$');
            out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(&programs::pack_cost(cost));
        out.extend_from_slice(&self.packed);
        if let Some((bytes, n)) = &bounds {
            out.extend_from_slice(&bytes[..*n]);
        }
        out.extend_from_slice(tail);
        out.extend_from_slice(b"\r\n");
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

    /// Appends `ARGV[1]` for `cost` as one RESP bulk string: the cost, then the fields (and a
    /// calendar window's bounds).
    pub(crate) fn write_arguments(&self, out: &mut Vec<u8>, cost: u64) {
        self.write_fields(out, cost, &[]);
    }

    /// Appends a settlement member's arguments (`lua/rate-settle-v1.lua`) as one RESP bulk
    /// string: `actual` in the cost's place, the fields, then the hold.
    pub(crate) fn write_settle_arguments(
        &self,
        out: &mut Vec<u8>,
        actual: u64,
        estimate: u64,
        at_ms: u64,
    ) {
        let hold = programs::settle_hold(estimate, at_ms);
        self.write_fields(out, actual, hold.as_ref().map_or(&[][..], |h| &h[..]));
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

#[cfg(test)]
mod tests {
    use shared_contract::policy::calendar::CalendarUnit;

    use super::*;

    /// `ARGV[1]` as `write_arguments` writes it, without the RESP framing.
    fn argument(plan: &Plan, cost: u64) -> Vec<u8> {
        let mut out = Vec::new();
        plan.write_arguments(&mut out, cost);
        let body = out.splitn(2, |&b| b == b'\n').nth(1).expect("a bulk");
        body[..body.len() - 2].to_vec()
    }

    #[test]
    fn a_calendar_window_sends_the_periods_around_this_machines_clock() {
        let month = RateLimitPolicy::calendar("quota", 10, CalendarUnit::Month)
            .time_zone("Europe/Berlin")
            .build()
            .expect("valid");
        let plan = Plan::new("rl", &month).expect("a plan");
        let bytes = argument(&plan, 3);
        assert_eq!(
            bytes.len(),
            57,
            "33 bytes of fixed-window arguments and 4 bounds"
        );
        let b = |i: usize| {
            let mut v = [0u8; 8];
            v[..6].copy_from_slice(&bytes[33 + 6 * i..39 + 6 * i]);
            u64::from_le_bytes(v)
        };
        let now = wall_ms();
        assert!(b(0) < b(1) && b(1) <= now && now < b(2) && b(2) < b(3));
        let Algorithm::FixedWindow(w) = month.algorithm() else {
            panic!("a fixed window");
        };
        let calendar = w.calendar().expect("a calendar");
        assert_eq!(calendar.bounds(now), Some((b(1), b(2))));
        assert_eq!(calendar.bounds(b(1) - 1).map(|w| w.0), Some(b(0)));
        // Sent again from the cache, the same.
        assert_eq!(argument(&plan, 3), bytes);
        // An epoch-aligned window sends its 33 bytes.
        let hourly = RateLimitPolicy::fixed_window("api", 10)
            .build()
            .expect("valid");
        let hourly = Plan::new("rl", &hourly).expect("a plan");
        assert_eq!(argument(&hourly, 1).len(), 33);
        // A settlement's arguments end with the 13-byte hold, after the bounds if any; a hold
        // beyond its widths is left out, a length the program refuses.
        let settle = |plan: &Plan, at_ms: u64| {
            let mut out = Vec::new();
            plan.write_settle_arguments(&mut out, 2, 5, at_ms);
            let body = out
                .splitn(2, |&b| b == b'\n')
                .nth(1)
                .expect("a bulk")
                .to_vec();
            body[..body.len() - 2].to_vec()
        };
        let held = settle(&plan, 7);
        assert_eq!((held.len(), &held[1..57]), (70, &bytes[1..57]));
        assert_eq!(held[0], 2, "the actual cost in the cost's place");
        assert_eq!(&held[57..], &[5, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0]);
        assert_eq!(settle(&hourly, 7).len(), 46);
        assert_eq!(settle(&hourly, 1 << 48).len(), 33);
    }
}
