//! Batched decisions: single evaluations that are ready at the same moment for one node leave
//! as one call of `lua/rate-batch-v2.lua`, which decides each in order at one `TIME` reading
//! exactly as its single program would (docs/lua-programs.md, "The batch program").
//!
//! The first evaluation to find its group empty leads it: it yields once, so that the tasks
//! ready now add theirs, then takes every member (at most `batch_max` per call; more leave as
//! several calls at once). Alone, it sends its own single program, as without batching; so an
//! idle provider sends batches of one and a loaded one batches of many, with no timer. A group
//! is a node's: every request on standalone and Sentinel (one master), one slot on a cluster
//! (a script's keys must share a slot); with the connections spread over serving threads
//! ([`crate::placement`]), a node's per thread, so a batch leaves on its thread's connection.
//!
//! Certainty is per call, so per member: a batch not sent makes every member `Unavailable`, a
//! batch sent without a usable answer every member `Indeterminate`, and a reply that is not
//! exactly `n` rows every member `Incompatible(reply)`; a row is then checked like a single
//! program's reply. A caller that gives up before its batch leaves is dropped from it (nothing
//! sent, nothing charged); the batch is sent by a task of its own, so a leader that gives up
//! does not take its neighbours' calls with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use redis::Value;
use shared_contract::{IncompatibleCategory, UnavailableCategory};
use tokio::sync::oneshot;

use crate::failure::Failure;
use crate::plan::{Answer, Plan};
use crate::pool::{Pool, ScriptReply};
use crate::programs;
use crate::resp;
use crate::script::ScriptArgs;
use crate::wire::lock;

/// One evaluation waiting in a group.
struct Member {
    plan: Arc<Plan>,
    key: String,
    cost: u64,
    tx: oneshot::Sender<Answer>,
}

/// One decision to make: `cost` on `key` (of `slot`) under `plan`.
pub(crate) struct Decision<'a> {
    pub(crate) plan: &'a Arc<Plan>,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) slot: u16,
}

/// A group: the node's (the slot on a cluster, else 0) and, when the connections are spread
/// over serving threads, the caller's thread: each thread batches onto its own connection.
type Group = (u16, Option<ThreadId>);

/// The groups of members being gathered, and what batching has done so far.
pub(crate) struct Batcher {
    max: usize,
    groups: Mutex<HashMap<Group, Vec<Member>>>,
    calls: AtomicU64,
    members: AtomicU64,
}

/// Calls of the batch program and the members they decided, since the provider started
/// (a member decided alone is sent as its single program and not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchStats {
    /// Batch program calls sent.
    pub calls: u64,
    /// Members those calls carried.
    pub members: u64,
}

/// The lead of a group while it yields: dropped early (its caller gave up), it still sends
/// the members that joined.
struct Lead<'a> {
    batcher: &'a Arc<Batcher>,
    pool: &'a Arc<Pool>,
    group: Group,
    slot: u16,
    timeout: Duration,
    done: bool,
}

impl Lead<'_> {
    /// Takes the group's members that still wait (a caller gone is dropped: nothing sent).
    fn take(&mut self) -> Vec<Member> {
        self.done = true;
        let mut members = lock(&self.batcher.groups)
            .remove(&self.group)
            .unwrap_or_default();
        members.retain(|m| !m.tx.is_closed());
        members
    }

    /// Sends `members` as batch calls of at most `max`, each from a task of its own.
    fn send(&self, mut members: Vec<Member>) {
        while !members.is_empty() {
            let rest = members.split_off(members.len().min(self.batcher.max));
            let chunk = std::mem::replace(&mut members, rest);
            let (batcher, pool) = (self.batcher.clone(), self.pool.clone());
            let (slot, timeout) = (self.slot, self.timeout);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move { batcher.send(&pool, slot, chunk, timeout).await });
                }
                // No runtime (it is shutting down): the members get `Unavailable`, nothing sent.
                Err(_) => drop(chunk),
            }
        }
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if !self.done {
            let members = self.take();
            self.send(members);
        }
    }
}

impl Batcher {
    /// A batcher of at most `max` (1..=[`programs::BATCH_MAX`]) members per call.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.clamp(1, programs::BATCH_MAX),
            groups: Mutex::new(HashMap::new()),
            calls: AtomicU64::new(0),
            members: AtomicU64::new(0),
        }
    }

    /// Whether calls are batched at all (`batch_max` > 1).
    pub(crate) fn enabled(&self) -> bool {
        self.max > 1
    }

    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            calls: self.calls.load(Ordering::Relaxed),
            members: self.members.load(Ordering::Relaxed),
        }
    }

    /// Makes `decision` with the requests of its group that are ready now: as one batch call
    /// with them, or alone as its single program.
    pub(crate) async fn decide(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        decision: Decision<'_>,
        timeout: Duration,
    ) -> Answer {
        let Decision {
            plan,
            key,
            cost,
            slot,
        } = decision;
        // A script's keys must share a slot on a cluster; elsewhere one master takes them all.
        let node = if pool.is_cluster() { slot } else { 0 };
        let group = (node, pool.is_placed().then(crate::placement::this_thread));
        let (tx, rx) = oneshot::channel();
        let leads = {
            let mut groups = lock(&self.groups);
            let members = groups.entry(group).or_default();
            members.push(Member {
                plan: plan.clone(),
                key: key.to_owned(),
                cost,
                tx,
            });
            members.len() == 1
        };
        if leads {
            let mut lead = Lead {
                batcher: self,
                pool,
                group,
                slot,
                timeout,
                done: false,
            };
            // The tasks that are ready now run first and join this group.
            tokio::task::yield_now().await;
            let mut members = lead.take();
            if members.len() == 1 {
                // Alone: the single program, as without batching. (The one member left is this
                // caller's: every other waiter joined after it.)
                drop(members.pop());
                return plan.run(pool, slot, key, cost, timeout).await;
            }
            lead.send(members);
        }
        match rx.await {
            Ok(answer) => answer,
            // The batch was dropped before it was sent (the runtime is shutting down).
            Err(_) => Err(Failure::Unavailable(UnavailableCategory::Connect)),
        }
    }

    /// One batch call for `members` (2..=max of them, one group), and each member's answer.
    async fn send(&self, pool: &Pool, slot: u16, members: Vec<Member>, timeout: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.members
            .fetch_add(members.len() as u64, Ordering::Relaxed);
        let result = pool
            .run_script(
                &programs::BATCH,
                slot,
                &BatchCall { members: &members },
                timeout,
            )
            .await;
        let n = members.len();
        for (m, answer) in members.into_iter().zip(answers(result, n)) {
            let _ = m.tx.send(answer);
        }
    }
}

/// Each member's answer from one batch call's result: its row; or, for every member alike,
/// the call's failure (not sent: `Unavailable`; sent, no usable reply: `Indeterminate`), or
/// `Incompatible(reply)` when the reply is not exactly `n` rows. Never an allow a row did not
/// state.
fn answers(result: Result<ScriptReply, Failure>, n: usize) -> Vec<Answer> {
    let failure = match result {
        Err(failure) => failure,
        Ok(reply) => match rows(reply.value, n) {
            Ok(rows) => {
                return rows
                    .into_iter()
                    .map(|value| {
                        Ok(ScriptReply {
                            value,
                            replicas_acked: reply.replicas_acked,
                        })
                    })
                    .collect();
            }
            Err(why) => {
                tracing::warn!(members = n, %why, "refused a batch reply");
                Failure::Incompatible(IncompatibleCategory::Reply)
            }
        },
    };
    (0..n).map(|_| Err(failure)).collect()
}

/// The bytes of one packed row: a status code, then six 7-byte numbers.
const ROW_BYTES: usize = 1 + 6 * 7;

/// The statuses of a packed row by code (1-based), as the seven-field reply spells them.
const STATUSES: [&str; 5] = [
    "ALLOWED",
    "DENIED",
    "CLOCK_UNSAFE",
    "STATE_INCOMPATIBLE",
    "INVALID",
];

/// The rows of a batch reply of `n` members, `{DECIDED, row_1, ..., row_n}` exactly, each
/// unpacked into the seven-field reply its single program would give (which the caller then
/// checks like one).
fn rows(value: Value, n: usize) -> Result<Vec<Value>, String> {
    let Value::Array(items) = value else {
        return Err(format!("not an array: {value:?}"));
    };
    match items.first() {
        Some(Value::BulkString(s)) if s == b"DECIDED" => {}
        other => return Err(format!("status {other:?}, not DECIDED")),
    }
    if items.len() != n + 1 {
        return Err(format!("{} rows for {n} members", items.len() - 1));
    }
    items[1..].iter().map(unpack_row).collect()
}

/// One packed row as the seven-field reply: its status, then its numbers (at most 2^56-1
/// here; the reply parser refuses any above 2^53-1).
fn unpack_row(row: &Value) -> Result<Value, String> {
    let Value::BulkString(b) = row else {
        return Err(format!("row {row:?} is not a string"));
    };
    if b.len() != ROW_BYTES {
        return Err(format!("row of {} bytes, not {ROW_BYTES}", b.len()));
    }
    let status = usize::from(b[0])
        .checked_sub(1)
        .and_then(|i| STATUSES.get(i))
        .ok_or_else(|| format!("unknown status code {}", b[0]))?;
    let mut fields = Vec::with_capacity(7);
    fields.push(Value::BulkString(status.as_bytes().to_vec()));
    for chunk in b[1..].chunks_exact(7) {
        let mut n = [0u8; 8];
        n[..7].copy_from_slice(chunk);
        // Seven bytes hold at most 2^56-1, so the conversion never fails.
        fields.push(Value::Int(i64::from_le_bytes(n)));
    }
    Ok(Value::Array(fields))
}

/// Whether a packed row says `ALLOWED`.
fn row_allowed(row: &Value) -> bool {
    matches!(row, Value::BulkString(b) if b.len() == ROW_BYTES && b[0] == 1)
}

/// One batch program call: `n keys... header (code packed-arguments)...` after
/// `EVALSHA sha1`.
struct BatchCall<'a> {
    members: &'a [Member],
}

impl ScriptArgs for BatchCall<'_> {
    fn count(&self) -> usize {
        1 + self.members.len() + 1 + 2 * self.members.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        resp::write_bulk_u64(out, self.members.len() as u64);
        for m in self.members {
            resp::write_bulk(out, m.key.as_bytes());
        }
        // The header is one byte, n (at most 64).
        resp::write_bulk(out, &[self.members.len() as u8]);
        for m in self.members {
            resp::write_bulk_u64(out, m.plan.code);
            m.plan.write_arguments(out, m.cost);
        }
    }

    /// A batch wrote state when any member was admitted.
    fn needs_ack(&self, value: &Value) -> bool {
        matches!(value, Value::Array(items) if items.iter().skip(1).any(row_allowed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packed row of status `code` whose six numbers are `n`, `n + 1`, ...
    fn row(code: u8, n: u64) -> Value {
        let mut b = vec![code];
        for i in 0..6 {
            b.extend_from_slice(&(n + i).to_le_bytes()[..7]);
        }
        Value::BulkString(b)
    }

    fn seven(status: &str, n: i64) -> Value {
        let mut v = vec![Value::BulkString(status.as_bytes().to_vec())];
        v.extend((0..6).map(|i| Value::Int(n + i)));
        Value::Array(v)
    }

    #[test]
    fn a_reply_of_exactly_n_packed_rows_is_unpacked_and_anything_else_refused() {
        let decided = Value::BulkString(b"DECIDED".to_vec());
        let reply = Value::Array(vec![decided.clone(), row(1, 10), row(4, 0)]);
        assert_eq!(
            rows(reply, 2).expect("two rows"),
            vec![seven("ALLOWED", 10), seven("STATE_INCOMPATIBLE", 0)]
        );
        // The largest number seven bytes hold comes through (the reply parser refuses it).
        let max = (1i64 << 56) - 1;
        let big = Value::Array(vec![decided.clone(), row(2, (1 << 56) - 6)]);
        assert_eq!(rows(big, 1).expect("a row"), vec![seven("DENIED", max - 5)]);
        let mut short = match row(1, 1) {
            Value::BulkString(b) => b,
            _ => unreachable!(),
        };
        short.pop();
        for (bad, n) in [
            (Value::Array(vec![decided.clone(), row(1, 1)]), 2),
            (
                Value::Array(vec![decided.clone(), row(1, 1), row(1, 1), row(1, 1)]),
                2,
            ),
            (Value::Array(vec![decided.clone(), row(0, 1)]), 1),
            (Value::Array(vec![decided.clone(), row(6, 1)]), 1),
            (
                Value::Array(vec![decided.clone(), Value::BulkString(short)]),
                1,
            ),
            (Value::Array(vec![decided.clone(), seven("ALLOWED", 1)]), 1),
            (
                Value::Array(vec![Value::BulkString(b"INVALID".to_vec())]),
                1,
            ),
            (Value::Array(vec![row(1, 1), row(1, 1)]), 1),
            (Value::Int(1), 1),
            (Value::Nil, 1),
        ] {
            assert!(rows(bad.clone(), n).is_err(), "{bad:?}");
        }
        assert!(row_allowed(&row(1, 0)) && !row_allowed(&row(2, 0)));
    }

    #[test]
    fn every_member_gets_its_row_or_the_calls_failure() {
        let decided = Value::BulkString(b"DECIDED".to_vec());
        let ok = |value: Value| {
            Ok(ScriptReply {
                value,
                replicas_acked: Some(1),
            })
        };
        let got = answers(ok(Value::Array(vec![decided, row(1, 5), row(2, 7)])), 2);
        let got: Vec<(Value, Option<u64>)> = got
            .into_iter()
            .map(|a| a.map(|r| (r.value, r.replicas_acked)).expect("a row"))
            .collect();
        assert_eq!(
            got,
            vec![
                (seven("ALLOWED", 5), Some(1)),
                (seven("DENIED", 7), Some(1))
            ]
        );
        let short = answers(ok(Value::Array(vec![row(1, 1)])), 3);
        assert_eq!(short.len(), 3);
        for a in short {
            assert_eq!(
                a.err(),
                Some(Failure::Incompatible(IncompatibleCategory::Reply))
            );
        }
        for failure in [
            Failure::Indeterminate,
            Failure::Unavailable(UnavailableCategory::Connect),
            Failure::Incompatible(IncompatibleCategory::Program),
        ] {
            let all = answers(Err(failure), 4);
            assert_eq!(all.len(), 4);
            assert!(all.iter().all(|a| a.as_ref().err() == Some(&failure)));
        }
    }

    #[test]
    fn batch_max_is_held_to_the_programs_bound() {
        assert_eq!(Batcher::new(0).max, 1);
        assert!(!Batcher::new(1).enabled());
        assert_eq!(Batcher::new(16).max, 16);
        assert_eq!(Batcher::new(1000).max, programs::BATCH_MAX);
    }
}
