//! The strict parsers of the gate programs' replies, records and stream entries, and their
//! mapping to [`GateOutcome`].
//!
//! Pure: they see only the [`redis::Value`] the server sent, so every rule is unit-tested
//! without a server. As for the rate-limit programs, anything this build does not know
//! exactly (another arity, an unknown status, a number that is not an integer in
//! `0..=2^53-1`, a record or entry of another shape, a reply that contradicts the gate's
//! settings) is a [`ReplyError`], reported as `Incompatible(reply)`.
//!
//! | status | outcome |
//! | --- | --- |
//! | `SUBMITTED` / `REJECTED` / `DUPLICATE` / `ID_REUSED` | `Evaluated` (after consistency checks) |
//! | `PUBLISHED` / `SWEPT` / `SNAPSHOT` / `UPDATES` | `Evaluated` |
//! | `FULL` | `Unavailable(admission)` (the model's `Full`) |
//! | `CLOCK_UNSAFE` | `Unavailable(clock)`, retry after the program's `retry_after_ms` |
//! | `CLOCK_EXHAUSTED`, `STATE_INCOMPATIBLE` | `Incompatible(state)` |
//! | `INVALID` | `Incompatible(program)`: this build sent arguments the program refuses |
//! | anything else | `Incompatible(reply)` |

use redis::Value;
use shared_contract::gate::{
    EventId, EventKey, EventRecord, EventStatus, GateClock, GateError, GateOutcome, GateSettings,
    IncubatingEvent, Snapshot, StatusUpdate, SubmitOutcome, UpdateBatch,
};
use shared_contract::{IncompatibleCategory, UnavailableCategory};

use crate::reply::{kind, number};

/// Why a reply was refused (reported as `Incompatible(reply)`, logged with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// The reply is not an array; the kind of value it is.
    #[error("reply is not an array but {0}")]
    NotAnArray(&'static str),
    /// The reply has another number of fields than the program's reply.
    #[error("reply has {got} fields, expected {expected}")]
    Arity {
        /// Fields in the reply.
        got: usize,
        /// Fields the program's reply has.
        expected: usize,
    },
    /// A status this build does not know (as sent).
    #[error("unknown status {0:?}")]
    Status(String),
    /// A field of the reply is not what its position holds.
    #[error("field {index}: {problem}")]
    Field {
        /// The field's position in the reply, from 0.
        index: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// An event's stored record does not parse (shape, range, key or terminal time).
    #[error("malformed record of event {id}: {problem}")]
    Record {
        /// The event's id.
        id: String,
        /// What is wrong with the record.
        problem: &'static str,
    },
    /// A stream entry has another shape.
    #[error("malformed stream entry {entry}: {problem}")]
    Entry {
        /// The entry's id (its first 40 characters), `"?"` when it has none.
        entry: String,
        /// What is wrong with the entry.
        problem: &'static str,
    },
    /// A well-formed reply that contradicts the gate's settings or the call; what it contradicts.
    #[error("reply contradicts the gate: {0}")]
    Inconsistent(&'static str),
}

fn fields(value: &Value, expected: usize) -> Result<&[Value], ReplyError> {
    match value {
        Value::Array(f) if f.len() == expected => Ok(f),
        Value::Array(f) => Err(ReplyError::Arity {
            got: f.len(),
            expected,
        }),
        other => Err(ReplyError::NotAnArray(kind(other))),
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(v: &Value, index: usize) -> Result<&str, ReplyError> {
    bytes(v)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or(ReplyError::Field {
            index,
            problem: "not a UTF-8 string",
        })
}

fn num(v: &Value, index: usize) -> Result<u64, ReplyError> {
    number(v).map_err(|problem| ReplyError::Field { index, problem })
}

fn clock(v: u64) -> Result<GateClock, ReplyError> {
    GateClock::new(v).map_err(|_| ReplyError::Inconsistent("clock above 2^53-1"))
}

/// The refusals every mutating program shares; `None` for a status that is not one.
fn refusal<T>(status: &str, retry_after_ms: u64) -> Option<GateOutcome<T>> {
    Some(match status {
        "FULL" => GateOutcome::Unavailable {
            retry_after_ms: GateError::RETRY_AFTER_MS,
            category: UnavailableCategory::Admission,
        },
        "CLOCK_UNSAFE" => GateOutcome::Unavailable {
            retry_after_ms: retry_after_ms.max(1),
            category: UnavailableCategory::Clock,
        },
        "CLOCK_EXHAUSTED" | "STATE_INCOMPATIBLE" => GateOutcome::Incompatible {
            category: IncompatibleCategory::State,
        },
        "INVALID" => GateOutcome::Incompatible {
            category: IncompatibleCategory::Program,
        },
        _ => return None,
    })
}

/// The seven fields of a mutating program's reply, numbers checked.
struct Mutation<'a> {
    status: &'a str,
    effective_now_ms: u64,
    clock: u64,
    n: u64,
    retry_after_ms: u64,
    last: &'a Value,
}

fn mutation(value: &Value) -> Result<Mutation<'_>, ReplyError> {
    let f = fields(value, 7)?;
    let status = text(&f[0], 0)?;
    num(&f[1], 1)?;
    Ok(Mutation {
        status,
        effective_now_ms: num(&f[2], 2)?,
        clock: num(&f[3], 3)?,
        n: num(&f[4], 4)?,
        retry_after_ms: num(&f[5], 5)?,
        last: &f[6],
    })
}

/// Parses a stored record `"<S|P|I>:<clock>:<submitted_at>:<publish_at>:<terminal_at>:<key>"`.
///
/// # Errors
/// [`ReplyError::Record`] for any other shape, a number out of range, an invalid key, or a
/// terminal time that does not fit the status.
pub fn record(id: &EventId, raw: &[u8]) -> Result<EventRecord, ReplyError> {
    let bad = |problem| ReplyError::Record {
        id: id.to_string(),
        problem,
    };
    let s = std::str::from_utf8(raw).map_err(|_| bad("not UTF-8"))?;
    let mut parts = s.splitn(6, ':');
    let mut next = || parts.next().ok_or_else(|| bad("too few fields"));
    let status = match next()? {
        "S" => EventStatus::Submitted,
        "P" => EventStatus::Published,
        "I" => EventStatus::Invalidated,
        _ => return Err(bad("unknown status")),
    };
    let n = |t: &str| crate::reply::decimal(t.as_bytes()).map_err(bad);
    let c = n(next()?)?;
    let submitted_at_ms = n(next()?)?;
    let publish_at_ms = n(next()?)?;
    let terminal = next()?;
    let key = EventKey::new(next()?).map_err(|_| bad("invalid key"))?;
    let terminal_at_ms = match (status.is_terminal(), terminal) {
        (false, "") => None,
        (true, t) if !t.is_empty() => Some(n(t)?),
        _ => return Err(bad("terminal time does not fit the status")),
    };
    if c == 0 || publish_at_ms < submitted_at_ms {
        return Err(bad("clock 0 or publish time before submission"));
    }
    Ok(EventRecord {
        id: id.clone(),
        key,
        status,
        clock: clock(c)?,
        submitted_at_ms,
        publish_at_ms,
        terminal_at_ms,
    })
}

/// The answer of `gate-submit-v1.lua` for the event `id` at `gate`.
///
/// # Errors
/// [`ReplyError`] for anything but a well-formed reply consistent with the gate.
pub fn submit(
    value: &Value,
    gate: &GateSettings,
    id: &EventId,
) -> Result<GateOutcome<SubmitOutcome>, ReplyError> {
    let m = mutation(value)?;
    let publish_at_ms = m.n;
    match m.status {
        "SUBMITTED" => {
            if m.clock == 0 || publish_at_ms != m.effective_now_ms + gate.duration_ms() {
                return Err(ReplyError::Inconsistent(
                    "a submission's publish time is not now + duration",
                ));
            }
            Ok(GateOutcome::Evaluated(SubmitOutcome::Submitted {
                clock: clock(m.clock)?,
                publish_at_ms,
            }))
        }
        "REJECTED" => {
            let with = EventId::new(text(m.last, 6)?).map_err(|_| ReplyError::Field {
                index: 6,
                problem: "conflicts_with is not an event id",
            })?;
            if m.clock == 0 {
                return Err(ReplyError::Inconsistent("a rejection at clock 0"));
            }
            Ok(GateOutcome::Evaluated(SubmitOutcome::Rejected {
                clock: clock(m.clock)?,
                conflicts_with: with,
            }))
        }
        "DUPLICATE" | "ID_REUSED" => {
            let raw = bytes(m.last).ok_or(ReplyError::Field {
                index: 6,
                problem: "the record is not a string",
            })?;
            let r = record(id, raw)?;
            if r.clock.get() != m.clock || r.publish_at_ms != publish_at_ms {
                return Err(ReplyError::Inconsistent(
                    "a duplicate's fields differ from its record",
                ));
            }
            Ok(GateOutcome::Evaluated(if m.status == "DUPLICATE" {
                SubmitOutcome::Duplicate(r)
            } else {
                SubmitOutcome::IdReused(r)
            }))
        }
        s => refusal(s, m.retry_after_ms).ok_or_else(|| ReplyError::Status(s.to_owned())),
    }
}

/// [`submit`] for the event `id` of `key`, also holding the held record to the status: a
/// `DUPLICATE` holds this key, an `ID_REUSED` another one.
///
/// # Errors
/// As [`submit`], and [`ReplyError::Inconsistent`] when the record's key contradicts the
/// status.
pub fn submit_of(
    value: &Value,
    gate: &GateSettings,
    id: &EventId,
    key: &EventKey,
) -> Result<GateOutcome<SubmitOutcome>, ReplyError> {
    let outcome = submit(value, gate, id)?;
    match outcome.evaluated() {
        Some(SubmitOutcome::Duplicate(r)) if &r.key != key => Err(ReplyError::Inconsistent(
            "a duplicate holds another key than the submission's",
        )),
        Some(SubmitOutcome::IdReused(r)) if &r.key == key => Err(ReplyError::Inconsistent(
            "a reused id holds the submission's own key",
        )),
        _ => Ok(outcome),
    }
}

/// What one call of `gate-publish-v1.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Events published by this call (at most the `max_batch` asked for).
    pub count: usize,
    /// The earliest publish time still incubating (server time), if any.
    pub next_due_ms: Option<u64>,
    /// The gate time the call acted at.
    pub effective_now_ms: u64,
}

/// The answer of `gate-publish-v1.lua`, asked for at most `max_batch` events.
///
/// # Errors
/// [`ReplyError`] for anything but a well-formed reply.
pub fn publish(value: &Value, max_batch: usize) -> Result<GateOutcome<Published>, ReplyError> {
    let m = mutation(value)?;
    match m.status {
        "PUBLISHED" => {
            let count = usize::try_from(m.n).unwrap_or(usize::MAX);
            if count > max_batch {
                return Err(ReplyError::Inconsistent("published more than the batch"));
            }
            let next_due_ms = num(m.last, 6)?;
            Ok(GateOutcome::Evaluated(Published {
                count,
                next_due_ms: (next_due_ms != 0).then_some(next_due_ms),
                effective_now_ms: m.effective_now_ms,
            }))
        }
        s => refusal(s, m.retry_after_ms).ok_or_else(|| ReplyError::Status(s.to_owned())),
    }
}

/// The answer of `gate-sweep-v1.lua`: how many events were removed.
///
/// # Errors
/// [`ReplyError`] for anything but a well-formed reply.
pub fn sweep(value: &Value, max_batch: usize) -> Result<GateOutcome<usize>, ReplyError> {
    let m = mutation(value)?;
    match m.status {
        "SWEPT" => {
            let removed = usize::try_from(m.n).unwrap_or(usize::MAX);
            let pruned = usize::try_from(num(m.last, 6)?).unwrap_or(usize::MAX);
            if removed > max_batch || pruned > max_batch {
                return Err(ReplyError::Inconsistent("removed more than the batch"));
            }
            Ok(GateOutcome::Evaluated(removed))
        }
        s => refusal(s, m.retry_after_ms).ok_or_else(|| ReplyError::Status(s.to_owned())),
    }
}

fn read_refusal<T>(status: &str) -> Result<GateOutcome<T>, ReplyError> {
    match status {
        "STATE_INCOMPATIBLE" => Ok(GateOutcome::Incompatible {
            category: IncompatibleCategory::State,
        }),
        "INVALID" => Ok(GateOutcome::Incompatible {
            category: IncompatibleCategory::Program,
        }),
        s => Err(ReplyError::Status(s.to_owned())),
    }
}

/// The answer of `gate-snapshot-v1.lua`.
///
/// # Errors
/// [`ReplyError`] for anything but a well-formed reply whose entries are incubating records
/// in due order.
pub fn snapshot(value: &Value) -> Result<GateOutcome<Snapshot>, ReplyError> {
    let f = fields(value, 3)?;
    let status = text(&f[0], 0)?;
    if status != "SNAPSHOT" {
        return read_refusal(status);
    }
    let c = clock(num(&f[1], 1)?)?;
    let Value::Array(flat) = &f[2] else {
        return Err(ReplyError::Field {
            index: 2,
            problem: "entries are not an array",
        });
    };
    if flat.len() % 2 != 0 {
        return Err(ReplyError::Field {
            index: 2,
            problem: "entries are not id/record pairs",
        });
    }
    let mut incubating = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks_exact(2) {
        let id = EventId::new(text(&pair[0], 2)?).map_err(|_| ReplyError::Field {
            index: 2,
            problem: "an entry id is not an event id",
        })?;
        let raw = bytes(&pair[1]).ok_or(ReplyError::Field {
            index: 2,
            problem: "a record is not a string",
        })?;
        let r = record(&id, raw)?;
        if r.status != EventStatus::Submitted || r.clock > c {
            return Err(ReplyError::Inconsistent(
                "a snapshot entry is not incubating or is newer than the clock",
            ));
        }
        incubating.push(IncubatingEvent {
            id,
            key: r.key,
            submitted_at_ms: r.submitted_at_ms,
            publish_at_ms: r.publish_at_ms,
        });
    }
    if incubating
        .windows(2)
        .any(|w| (w[0].publish_at_ms, &w[0].id) >= (w[1].publish_at_ms, &w[1].id))
    {
        return Err(ReplyError::Inconsistent(
            "snapshot entries out of due order",
        ));
    }
    Ok(GateOutcome::Evaluated(Snapshot {
        clock: c,
        incubating,
    }))
}

/// One stream entry `["<clock>-0", ["s", S|P|I, "i", id, "k", key, "a", at, "p", publish_at]]`.
///
/// # Errors
/// [`ReplyError::Entry`] for any other shape.
pub fn entry(value: &Value) -> Result<StatusUpdate, ReplyError> {
    let bad = |entry: &str, problem| ReplyError::Entry {
        entry: entry.chars().take(40).collect(),
        problem,
    };
    let Value::Array(pair) = value else {
        return Err(bad("?", "not an array"));
    };
    let [entry_id, Value::Array(kv)] = pair.as_slice() else {
        return Err(bad("?", "not an id and a field list"));
    };
    let entry_id = bytes(entry_id)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| bad("?", "id is not a string"))?;
    let c = entry_id
        .strip_suffix("-0")
        .and_then(|c| crate::reply::decimal(c.as_bytes()).ok())
        .filter(|&c| c > 0)
        .ok_or_else(|| bad(entry_id, "id is not <clock>-0"))?;
    if kv.len() != 10 {
        return Err(bad(entry_id, "not exactly five fields"));
    }
    let get = |i: usize, name: &[u8]| -> Result<&str, ReplyError> {
        if bytes(&kv[i]) != Some(name) {
            return Err(bad(entry_id, "fields out of order"));
        }
        bytes(&kv[i + 1])
            .and_then(|b| std::str::from_utf8(b).ok())
            .ok_or_else(|| bad(entry_id, "a value is not UTF-8"))
    };
    let status = match get(0, b"s")? {
        "S" => EventStatus::Submitted,
        "P" => EventStatus::Published,
        "I" => EventStatus::Invalidated,
        _ => return Err(bad(entry_id, "unknown status")),
    };
    let id = EventId::new(get(2, b"i")?).map_err(|_| bad(entry_id, "invalid event id"))?;
    let key = EventKey::new(get(4, b"k")?).map_err(|_| bad(entry_id, "invalid key"))?;
    let at_ms = crate::reply::decimal(get(6, b"a")?.as_bytes()).map_err(|p| bad(entry_id, p))?;
    let publish_at_ms =
        crate::reply::decimal(get(8, b"p")?.as_bytes()).map_err(|p| bad(entry_id, p))?;
    Ok(StatusUpdate {
        clock: clock(c)?,
        id,
        key,
        status,
        at_ms,
        publish_at_ms,
    })
}

/// The answer of `gate-updates-v1.lua` for the cursor `after` and at most `max` updates.
///
/// # Errors
/// [`ReplyError`] for anything but a well-formed reply whose entries are above the cursor,
/// in strictly increasing clock order, at most `max`, none above the gate's clock.
pub fn updates(
    value: &Value,
    after: GateClock,
    max: usize,
) -> Result<GateOutcome<UpdateBatch>, ReplyError> {
    let f = fields(value, 4)?;
    let status = text(&f[0], 0)?;
    if status != "UPDATES" {
        return read_refusal(status);
    }
    let c = clock(num(&f[1], 1)?)?;
    let resync = match num(&f[2], 2)? {
        0 => false,
        1 => true,
        _ => {
            return Err(ReplyError::Field {
                index: 2,
                problem: "resync is neither 0 nor 1",
            });
        }
    };
    let Value::Array(entries) = &f[3] else {
        return Err(ReplyError::Field {
            index: 3,
            problem: "entries are not an array",
        });
    };
    if resync {
        return Ok(GateOutcome::Evaluated(UpdateBatch::Resync));
    }
    if entries.len() > max {
        return Err(ReplyError::Inconsistent("more entries than asked for"));
    }
    let mut out = Vec::with_capacity(entries.len());
    let mut last = after;
    for e in entries {
        let u = entry(e)?;
        if u.clock <= last || u.clock > c {
            return Err(ReplyError::Inconsistent(
                "entries not above the cursor, not increasing, or above the clock",
            ));
        }
        last = u.clock;
        out.push(u);
    }
    Ok(GateOutcome::Evaluated(UpdateBatch::Updates(out)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::gate::{GateId, GateMode, GateSpec};

    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn gate() -> GateSettings {
        GateSettings::new(GateSpec::new(
            GateId::new("orders").expect("valid id"),
            GateMode::StrictlyOnce,
            Duration::from_millis(300),
        ))
        .expect("valid gate")
    }

    fn id(s: &str) -> EventId {
        EventId::new(s).expect("valid id")
    }

    fn key(s: &str) -> EventKey {
        EventKey::new(s).expect("valid key")
    }

    fn reply(status: &str, eff: i64, clock: i64, n: i64, retry: i64, last: Value) -> Value {
        Value::Array(vec![
            bulk(status),
            Value::Int(eff),
            Value::Int(eff),
            Value::Int(clock),
            Value::Int(n),
            Value::Int(retry),
            last,
        ])
    }

    #[test]
    fn a_submission_is_evaluated_only_when_its_publish_time_fits_the_duration() {
        let ok = reply("SUBMITTED", 1000, 1, 1300, 0, bulk(""));
        assert_eq!(
            submit(&ok, &gate(), &id("e1")),
            Ok(GateOutcome::Evaluated(SubmitOutcome::Submitted {
                clock: GateClock::new(1).expect("clock"),
                publish_at_ms: 1300
            }))
        );
        let off = reply("SUBMITTED", 1000, 1, 1299, 0, bulk(""));
        assert!(submit(&off, &gate(), &id("e1")).is_err());
    }

    #[test]
    fn a_rejection_names_the_conflicting_event() {
        let r = reply("REJECTED", 1000, 4, 0, 0, bulk("e2"));
        match submit(&r, &gate(), &id("e3")) {
            Ok(GateOutcome::Evaluated(SubmitOutcome::Rejected { conflicts_with, .. })) => {
                assert_eq!(conflicts_with, id("e2"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            submit(
                &reply("REJECTED", 1000, 4, 0, 0, bulk("")),
                &gate(),
                &id("e3")
            )
            .is_err()
        );
    }

    #[test]
    fn a_duplicate_carries_the_stored_record() {
        let r = reply(
            "DUPLICATE",
            2000,
            5,
            1300,
            0,
            bulk("P:5:1000:1300:1301:taco:al pastor"),
        );
        match submit(&r, &gate(), &id("e1")) {
            Ok(GateOutcome::Evaluated(SubmitOutcome::Duplicate(rec))) => {
                assert_eq!(rec.status, EventStatus::Published);
                assert_eq!(rec.key.as_str(), "taco:al pastor");
                assert_eq!(rec.terminal_at_ms, Some(1301));
            }
            other => panic!("{other:?}"),
        }
        let lying = reply(
            "DUPLICATE",
            2000,
            6,
            1300,
            0,
            bulk("P:5:1000:1300:1301:taco"),
        );
        assert!(submit(&lying, &gate(), &id("e1")).is_err());
    }

    #[test]
    fn a_reused_id_carries_the_held_record_and_must_hold_another_key() {
        let held = || bulk("S:5:1000:1300::alpha");
        let r = reply("ID_REUSED", 2000, 5, 1300, 0, held());
        match submit_of(&r, &gate(), &id("dup-1"), &key("beta")) {
            Ok(GateOutcome::Evaluated(SubmitOutcome::IdReused(rec))) => {
                assert_eq!(rec.key.as_str(), "alpha");
                assert_eq!(rec.status, EventStatus::Submitted);
            }
            other => panic!("{other:?}"),
        }
        // The status and the record's key must agree with the submission's key.
        assert!(submit_of(&r, &gate(), &id("dup-1"), &key("alpha")).is_err());
        let dup = reply("DUPLICATE", 2000, 5, 1300, 0, held());
        assert!(submit_of(&dup, &gate(), &id("dup-1"), &key("beta")).is_err());
        assert!(matches!(
            submit_of(&dup, &gate(), &id("dup-1"), &key("alpha")),
            Ok(GateOutcome::Evaluated(SubmitOutcome::Duplicate(_)))
        ));
    }

    #[test]
    fn refusals_map_to_honest_outcomes_and_unknown_statuses_are_errors() {
        let g = gate();
        let e = id("e");
        let full = submit(&reply("FULL", 1, 0, 0, 0, bulk("")), &g, &e);
        assert!(matches!(
            full,
            Ok(GateOutcome::Unavailable {
                category: UnavailableCategory::Admission,
                ..
            })
        ));
        let clock = submit(&reply("CLOCK_UNSAFE", 1, 0, 0, 2500, bulk("")), &g, &e);
        assert_eq!(
            clock,
            Ok(GateOutcome::Unavailable {
                retry_after_ms: 2500,
                category: UnavailableCategory::Clock
            })
        );
        let state = submit(&reply("STATE_INCOMPATIBLE", 1, 0, 0, 0, bulk("")), &g, &e);
        assert_eq!(
            state,
            Ok(GateOutcome::Incompatible {
                category: IncompatibleCategory::State
            })
        );
        let invalid = publish(&reply("INVALID", 1, 0, 0, 0, Value::Int(0)), 10);
        assert_eq!(
            invalid,
            Ok(GateOutcome::Incompatible {
                category: IncompatibleCategory::Program
            })
        );
        assert!(submit(&reply("ALLOWED", 1, 0, 0, 0, bulk("")), &g, &e).is_err());
        assert!(publish(&Value::Array(vec![bulk("PUBLISHED")]), 10).is_err());
        assert!(sweep(&Value::Int(3), 10).is_err());
    }

    #[test]
    fn publish_refuses_more_than_the_batch_and_reads_next_due() {
        let ok = reply("PUBLISHED", 1000, 9, 2, 0, Value::Int(1300));
        assert_eq!(
            publish(&ok, 2),
            Ok(GateOutcome::Evaluated(Published {
                count: 2,
                next_due_ms: Some(1300),
                effective_now_ms: 1000
            }))
        );
        assert!(publish(&ok, 1).is_err());
        let negative = reply("PUBLISHED", 1000, 9, -1, 0, Value::Int(0));
        assert!(publish(&negative, 2).is_err());
    }

    #[test]
    fn records_are_parsed_strictly() {
        let e = id("e1");
        assert!(record(&e, b"S:1:1000:1300::taco").is_ok());
        for bad in [
            "S:1:1000:1300:1400:taco",
            "P:1:1000:1300::taco",
            "X:1:1000:1300::taco",
            "S:01:1000:1300::taco",
            "S:0:1000:1300::taco",
            "S:1:1000:900::taco",
            "S:1:1000:1300::",
            "S:1:1000:1300",
        ] {
            assert!(record(&e, bad.as_bytes()).is_err(), "{bad}");
        }
    }

    fn stream_entry(c: &str, s: &str, i: &str) -> Value {
        Value::Array(vec![
            bulk(c),
            Value::Array(
                ["s", s, "i", i, "k", "taco", "a", "1000", "p", "1300"]
                    .into_iter()
                    .map(bulk)
                    .collect(),
            ),
        ])
    }

    #[test]
    fn updates_are_above_the_cursor_increasing_and_bounded() {
        let ok = Value::Array(vec![
            bulk("UPDATES"),
            Value::Int(9),
            Value::Int(0),
            Value::Array(vec![
                stream_entry("3-0", "S", "e1"),
                stream_entry("5-0", "I", "e1"),
            ]),
        ]);
        let c = |v| GateClock::new(v).expect("clock");
        match updates(&ok, c(2), 10) {
            Ok(GateOutcome::Evaluated(UpdateBatch::Updates(u))) => {
                assert_eq!(u.len(), 2);
                assert_eq!(u[1].status, EventStatus::Invalidated);
                assert_eq!(u[1].clock, c(5));
            }
            other => panic!("{other:?}"),
        }
        assert!(updates(&ok, c(3), 10).is_err());
        assert!(updates(&ok, c(2), 1).is_err());
        let unordered = Value::Array(vec![
            bulk("UPDATES"),
            Value::Int(9),
            Value::Int(0),
            Value::Array(vec![
                stream_entry("5-0", "S", "e1"),
                stream_entry("3-0", "I", "e1"),
            ]),
        ]);
        assert!(updates(&unordered, c(0), 10).is_err());
        let resync = Value::Array(vec![
            bulk("UPDATES"),
            Value::Int(9),
            Value::Int(1),
            Value::Array(vec![]),
        ]);
        assert_eq!(
            updates(&resync, c(0), 10),
            Ok(GateOutcome::Evaluated(UpdateBatch::Resync))
        );
        assert!(entry(&stream_entry("3-1", "S", "e1")).is_err());
        assert!(entry(&stream_entry("3-0", "Q", "e1")).is_err());
    }

    #[test]
    fn snapshots_must_be_incubating_records_in_due_order() {
        let snap = |pairs: &[(&str, &str)]| {
            Value::Array(vec![
                bulk("SNAPSHOT"),
                Value::Int(7),
                Value::Array(pairs.iter().flat_map(|(i, r)| [bulk(i), bulk(r)]).collect()),
            ])
        };
        let ok = snap(&[("a", "S:1:1000:1300::x"), ("b", "S:2:1000:1300::y")]);
        match snapshot(&ok) {
            Ok(GateOutcome::Evaluated(s)) => assert_eq!(s.incubating.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(
            snapshot(&snap(&[
                ("b", "S:1:1000:1300::x"),
                ("a", "S:2:1000:1300::y")
            ]))
            .is_err()
        );
        assert!(snapshot(&snap(&[("a", "P:1:1000:1300:1300:x")])).is_err());
        assert!(snapshot(&snap(&[("a", "S:8:1000:1300::x")])).is_err());
    }
}
