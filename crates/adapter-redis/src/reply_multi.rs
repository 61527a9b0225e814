//! The strict parser of the multi-limit program's reply (`lua/rate-multi-v2.lua`), and its
//! mapping to a [`MultiOutcome`].
//!
//! Pure, like [`crate::reply`], whose seven-field parser reads every member's row. The reply
//! is `{status, replayed, index, row_1, ..., row_n}`; anything this build does not know
//! exactly (another shape, a row count that is not the request's, a status that its rows
//! contradict, a row that contradicts its policy) is `Incompatible(reply)`: an unknown answer
//! is never an allow.
//!
//! | status | outcome |
//! | --- | --- |
//! | `ALLOWED` / `DENIED` | `Evaluated` (every row checked against its policy; `replayed` from the reply) |
//! | `CLOCK_UNSAFE` | `Unavailable(clock)` of member `index`, retry after its row's `retry_after_ms` |
//! | `STATE_INCOMPATIBLE` | `Incompatible(state)` of member `index` (the first member for the replay key) |
//! | `INVALID` | `Incompatible(program)`: this build sent arguments the program refuses |

use redis::Value;
use shared_contract::{
    IncompatibleCategory, MultiDecision, MultiOutcome, RateLimitOutcome, RateLimitPolicy,
    UnavailableCategory,
};

use crate::reply::{self, Reply, ReplyError, Status, kind, number};

/// Fields before the rows: status, replayed, index.
const HEADER: usize = 3;

/// A multi-limit reply whose shape, status and rows are all valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiReply {
    /// The status of the whole evaluation.
    pub status: Status,
    /// The stored first reply of the evaluation id, answered again.
    pub replayed: bool,
    /// 0, or the 1-based member (n+1: the replay key) the status concerns.
    pub index: usize,
    /// One row per member, in order (none for a refused header).
    pub rows: Vec<Reply>,
}

fn status(v: &Value) -> Result<Status, ReplyError> {
    let bytes = match v {
        Value::BulkString(b) => b.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => {
            return Err(ReplyError::Field {
                index: 0,
                name: "status",
                problem: "not a string",
            });
        }
    };
    Status::parse(bytes).ok_or_else(|| {
        ReplyError::Status(String::from_utf8_lossy(bytes).chars().take(40).collect())
    })
}

/// Parses the raw reply of the multi program for a request of `members` limits.
///
/// # Errors
/// [`ReplyError`] for anything but the documented shape with `members` valid rows (or none,
/// for `INVALID` and for an unusable replay key), a replayed flag of 0 or 1 and an index in `0..=members + 1`.
pub fn parse(value: &Value, members: usize) -> Result<MultiReply, ReplyError> {
    let fields = match value {
        Value::Array(fields) => fields,
        other => return Err(ReplyError::NotAnArray(kind(other))),
    };
    if fields.len() < HEADER {
        return Err(ReplyError::Multi("fewer than three header fields"));
    }
    let status = status(&fields[0])?;
    let replayed = match number(&fields[1]) {
        Ok(0) => false,
        Ok(1) => true,
        _ => return Err(ReplyError::Multi("replayed is not 0 or 1")),
    };
    let index = number(&fields[2])
        .ok()
        .and_then(|i| usize::try_from(i).ok())
        .filter(|&i| i <= members + 1)
        .ok_or(ReplyError::Multi("index out of range"))?;
    let rows = fields[HEADER..]
        .iter()
        .enumerate()
        .map(|(i, row)| {
            reply::parse(row).map_err(|error| ReplyError::Member {
                index: i + 1,
                error: Box::new(error),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Nothing was evaluated when the header was refused or the replay key is unusable.
    let unevaluated =
        status == Status::Invalid || (status == Status::StateIncompatible && index == members + 1);
    let rows_ok = rows.len() == members || (unevaluated && rows.is_empty());
    if !rows_ok {
        return Err(ReplyError::Multi("not one row per member"));
    }
    if replayed && !matches!(status, Status::Allowed | Status::Denied) {
        return Err(ReplyError::Multi("a replay of something not a decision"));
    }
    Ok(MultiReply {
        status,
        replayed,
        index,
        rows,
    })
}

/// The row of member `index` (1-based), which must carry `status`.
fn member_row(reply: &MultiReply, status: Status) -> Result<&Reply, ReplyError> {
    reply
        .index
        .checked_sub(1)
        .and_then(|i| reply.rows.get(i))
        .filter(|row| row.status == status)
        .ok_or(ReplyError::Multi("the status names no member with it"))
}

/// What the program's answer means for `policies` (in member order, at least one).
///
/// # Errors
/// [`ReplyError`] when the status contradicts the rows or a row contradicts its policy.
pub fn decide(
    reply: &MultiReply,
    policies: &[&RateLimitPolicy],
) -> Result<MultiOutcome, ReplyError> {
    let first = policies.first().ok_or(ReplyError::Multi("no members"))?;
    let named = reply
        .index
        .checked_sub(1)
        .and_then(|i| policies.get(i))
        .unwrap_or(first);
    match reply.status {
        Status::Allowed | Status::Denied => {}
        Status::ClockUnsafe => {
            let row = member_row(reply, Status::ClockUnsafe)?;
            return Ok(MultiOutcome::Unavailable {
                policy_id: named.id().clone(),
                // At least 1 ms: the server clock has to catch up with stored time.
                retry_after_ms: row.retry_after_ms.max(1),
                category: UnavailableCategory::Clock,
            });
        }
        Status::StateIncompatible => {
            if reply.index <= policies.len() {
                member_row(reply, Status::StateIncompatible)?;
            }
            return Ok(MultiOutcome::Incompatible {
                policy_id: named.id().clone(),
                category: IncompatibleCategory::State,
            });
        }
        Status::Invalid => {
            return Ok(MultiOutcome::Incompatible {
                policy_id: named.id().clone(),
                category: IncompatibleCategory::Program,
            });
        }
    }
    if reply.index != 0 {
        return Err(ReplyError::Multi("a decision names a member"));
    }
    let mut decisions = Vec::with_capacity(policies.len());
    for (i, (row, policy)) in reply.rows.iter().zip(policies).enumerate() {
        let member = |error| ReplyError::Member {
            index: i + 1,
            error: Box::new(error),
        };
        if !matches!(row.status, Status::Allowed | Status::Denied) {
            return Err(member(ReplyError::Inconsistent(
                "a decision with a member that is not one",
            )));
        }
        match reply::decide(row, policy).map_err(member)? {
            RateLimitOutcome::Evaluated(d) => decisions.push(d),
            _ => return Err(member(ReplyError::Inconsistent("not a decision"))),
        }
    }
    let allowed = decisions.iter().all(|d| d.allowed);
    if allowed != (reply.status == Status::Allowed) {
        return Err(ReplyError::Multi("the status contradicts the rows"));
    }
    Ok(MultiOutcome::Evaluated(MultiDecision {
        allowed,
        decisions,
        replayed: reply.replayed,
    }))
}

/// [`parse`] then [`decide`]; any refusal is `Incompatible(reply)` of the first member.
///
/// `policies` must not be empty (a `Limits` never is); an empty slice answers
/// `Incompatible(reply)` of no policy it could name, so it is refused by the caller first.
pub fn outcome(value: &Value, policies: &[&RateLimitPolicy]) -> Option<MultiOutcome> {
    observed(value, policies, |_| {})
}

/// [`outcome`], showing `observe` the parsed reply when it made sense (the provider's clock
/// metrics, `crate::telemetry`); a refused reply is not shown.
pub fn observed(
    value: &Value,
    policies: &[&RateLimitPolicy],
    observe: impl FnOnce(&MultiReply),
) -> Option<MultiOutcome> {
    let first = policies.first()?;
    let decided =
        parse(value, policies.len()).and_then(|r| decide(&r, policies).inspect(|_| observe(&r)));
    Some(match decided {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::warn!(policy = %first.id(), %error, "refused a multi-limit program reply");
            MultiOutcome::Incompatible {
                policy_id: first.id().clone(),
                category: IncompatibleCategory::Reply,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{PolicyId, RateLimitPolicy};

    use super::*;

    fn policy(id: &str, limit: u64) -> RateLimitPolicy {
        RateLimitPolicy::fixed_window(id, limit)
            .cleanup_grace(Duration::from_secs(1))
            .max_clock_regression(Duration::from_secs(1))
            .build()
            .expect("valid policy")
    }

    const NOW: i64 = 1_764_672_000_123;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn row(status: &str, limit: i64, remaining: i64, retry: i64) -> Value {
        let mut v = vec![bulk(status)];
        v.extend([NOW, NOW, limit, remaining, retry, NOW + 1000].map(Value::Int));
        Value::Array(v)
    }

    fn multi(status: &str, replayed: i64, index: i64, rows: Vec<Value>) -> Value {
        let mut v = vec![bulk(status), Value::Int(replayed), Value::Int(index)];
        v.extend(rows);
        Value::Array(v)
    }

    fn two() -> (RateLimitPolicy, RateLimitPolicy) {
        (policy("a", 10), policy("b", 100))
    }

    fn run(value: &Value) -> MultiOutcome {
        let (a, b) = two();
        outcome(value, &[&a, &b]).expect("members")
    }

    fn incompatible(id: &str, category: IncompatibleCategory) -> MultiOutcome {
        MultiOutcome::Incompatible {
            policy_id: PolicyId::new(id).expect("valid id"),
            category,
        }
    }

    #[test]
    fn an_allowed_reply_is_every_members_decision() {
        let out = run(&multi(
            "ALLOWED",
            0,
            0,
            vec![row("ALLOWED", 10, 9, 0), row("ALLOWED", 100, 99, 0)],
        ));
        let d = out.decision().expect("a decision");
        assert!(d.allowed && !d.replayed);
        assert_eq!(d.decisions.len(), 2);
        assert_eq!(d.decisions[1].remaining, 99);
        assert_eq!(d.decisions[1].policy_id.as_str(), "b");
    }

    #[test]
    fn a_denied_reply_keeps_admitting_members_allowed_and_marks_replays() {
        let out = run(&multi(
            "DENIED",
            1,
            0,
            vec![row("ALLOWED", 10, 9, 0), row("DENIED", 100, 0, 5)],
        ));
        let d = out.decision().expect("a decision");
        assert!(!d.allowed && d.replayed);
        assert!(d.decisions[0].allowed && !d.decisions[1].allowed);
    }

    #[test]
    fn a_status_its_rows_contradict_is_incompatible_reply() {
        for v in [
            multi(
                "ALLOWED",
                0,
                0,
                vec![row("ALLOWED", 10, 9, 0), row("DENIED", 100, 0, 5)],
            ),
            multi(
                "DENIED",
                0,
                0,
                vec![row("ALLOWED", 10, 9, 0), row("ALLOWED", 100, 9, 0)],
            ),
            multi(
                "ALLOWED",
                0,
                1,
                vec![row("ALLOWED", 10, 9, 0), row("ALLOWED", 100, 9, 0)],
            ),
            multi(
                "CLOCK_UNSAFE",
                0,
                1,
                vec![row("ALLOWED", 10, 9, 0), row("CLOCK_UNSAFE", 100, 0, 5)],
            ),
            multi(
                "DENIED",
                0,
                0,
                vec![row("CLOCK_UNSAFE", 10, 0, 5), row("DENIED", 100, 0, 5)],
            ),
        ] {
            assert_eq!(
                run(&v),
                incompatible("a", IncompatibleCategory::Reply),
                "{v:?}"
            );
        }
    }

    #[test]
    fn unknown_shapes_are_incompatible_reply_never_allow() {
        let rows = || vec![row("ALLOWED", 10, 9, 0), row("ALLOWED", 100, 99, 0)];
        let mut bad = vec![
            Value::Nil,
            Value::Okay,
            bulk("ALLOWED"),
            Value::Array(vec![bulk("ALLOWED"), Value::Int(0)]),
            // One row short, one row too many, a replay flag of 2, an index past the keys.
            multi("ALLOWED", 0, 0, vec![row("ALLOWED", 10, 9, 0)]),
            multi("ALLOWED", 2, 0, rows()),
            multi("ALLOWED", 0, 4, rows()),
            multi("allowed", 0, 0, rows()),
            // A row of another policy's limit.
            multi(
                "ALLOWED",
                0,
                0,
                vec![row("ALLOWED", 11, 9, 0), row("ALLOWED", 100, 99, 0)],
            ),
            // A replayed refusal.
            multi("STATE_INCOMPATIBLE", 1, 3, rows()),
        ];
        let mut three = rows();
        three.push(row("ALLOWED", 100, 99, 0));
        bad.push(multi("ALLOWED", 0, 0, three));
        for v in bad {
            assert_eq!(
                run(&v),
                incompatible("a", IncompatibleCategory::Reply),
                "{v:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_member_they_concern() {
        let out = run(&multi(
            "CLOCK_UNSAFE",
            0,
            2,
            vec![row("ALLOWED", 10, 9, 0), row("CLOCK_UNSAFE", 100, 0, 700)],
        ));
        assert_eq!(
            out,
            MultiOutcome::Unavailable {
                policy_id: PolicyId::new("b").expect("valid id"),
                retry_after_ms: 700,
                category: UnavailableCategory::Clock,
            }
        );
        let state = multi(
            "STATE_INCOMPATIBLE",
            0,
            2,
            vec![row("ALLOWED", 10, 9, 0), row("STATE_INCOMPATIBLE", 0, 0, 0)],
        );
        assert_eq!(run(&state), incompatible("b", IncompatibleCategory::State));
        // The replay key (index n+1) holding something else: reported on the first member.
        let replay_key = multi("STATE_INCOMPATIBLE", 0, 3, vec![]);
        assert_eq!(
            run(&replay_key),
            incompatible("a", IncompatibleCategory::State)
        );
        // A member's refusal always comes with every row.
        assert_eq!(
            run(&multi("STATE_INCOMPATIBLE", 0, 2, vec![])),
            incompatible("a", IncompatibleCategory::Reply)
        );
        assert_eq!(
            run(&multi("INVALID", 0, 0, vec![])),
            incompatible("a", IncompatibleCategory::Program)
        );
        // The driver refusing member 2's algorithm code: no rows, that member named.
        assert_eq!(
            run(&multi("INVALID", 0, 2, vec![])),
            incompatible("b", IncompatibleCategory::Program)
        );
    }
}
