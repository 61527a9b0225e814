//! The strict parser of a program's seven-field reply, and its mapping to an outcome.
//!
//! Pure: it sees only the [`redis::Value`] the server sent, so every rule is unit-tested
//! without a server. Anything this build does not know exactly (another arity, an unknown
//! status, a number that is not a canonical decimal integer in `0..=2^53-1`, a reply that
//! contradicts the policy) is `Incompatible(reply)`: an unknown answer is never an allow.
//!
//! | status | outcome |
//! | --- | --- |
//! | `ALLOWED` / `DENIED` | `Evaluated` (after consistency checks against the policy) |
//! | `CLOCK_UNSAFE` | `Unavailable(clock)`, retry after the program's `retry_after_ms` |
//! | `STATE_INCOMPATIBLE` | `Incompatible(state)` |
//! | `INVALID` | `Incompatible(program)`: this build sent arguments the program refuses |
//! | anything else | `Incompatible(reply)` |

use redis::Value;
use shared_contract::exact::MAX_SAFE_INTEGER;
use shared_contract::{
    IncompatibleCategory, RateLimitDecision, RateLimitOutcome, RateLimitPolicy, Source,
    UnavailableCategory,
};

/// Number of fields of every reply.
pub const ARITY: usize = 7;

/// The status field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Admitted; state written.
    Allowed,
    /// Not admitted; nothing written.
    Denied,
    /// The server clock is behind the stored time by more than the policy allows; nothing written.
    ClockUnsafe,
    /// The key holds another type, schema, algorithm or revision, or a field out of range; nothing
    /// written.
    StateIncompatible,
    /// The program refused an argument this build sent; nothing written.
    Invalid,
}

impl Status {
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        Some(match bytes {
            b"ALLOWED" => Status::Allowed,
            b"DENIED" => Status::Denied,
            b"CLOCK_UNSAFE" => Status::ClockUnsafe,
            b"STATE_INCOMPATIBLE" => Status::StateIncompatible,
            b"INVALID" => Status::Invalid,
            _ => return None,
        })
    }
}

/// A reply whose shape, status and numbers are all valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// What the program decided.
    pub status: Status,
    /// The server's `TIME` at the call, Unix ms.
    pub server_now_ms: u64,
    /// The time the program decided at, Unix ms: `server_now_ms`, or a later stored time when the
    /// clock went back within the policy's bound.
    pub effective_now_ms: u64,
    /// The most cost admissible at once (limit, capacity or burst).
    pub limit: u64,
    /// Cost still admissible now, after this request.
    pub remaining: u64,
    /// Until this request alone could be admitted, in ms; 0 when allowed.
    pub retry_after_ms: u64,
    /// When the full quota is available again, Unix ms by the server's clock.
    pub reset_at_ms: u64,
}

/// Why a reply was refused (reported as `Incompatible(reply)`, logged with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// The reply is not an array; the kind of value it is.
    #[error("reply is not an array but {0}")]
    NotAnArray(&'static str),
    /// The reply has this many fields instead of [`ARITY`].
    #[error("reply has {0} fields, expected {ARITY}")]
    Arity(usize),
    /// A status this build does not know (as sent).
    #[error("unknown status {0:?}")]
    Status(String),
    /// A field is not a value its position accepts.
    #[error("field {index} ({name}): {problem}")]
    Field {
        /// The field's position in the reply, from 0.
        index: usize,
        /// The field's name (`status`, `server_now_ms`, ...).
        name: &'static str,
        /// What is wrong with its value.
        problem: &'static str,
    },
    /// A well-formed reply that contradicts the policy; what it contradicts.
    #[error("reply contradicts the policy: {0}")]
    Inconsistent(&'static str),
    /// The header or the rows of a multi-limit reply are malformed; how.
    #[error("multi-limit reply: {0}")]
    Multi(&'static str),
    /// A row of a multi-limit reply was refused.
    #[error("multi-limit reply, member {index}: {error}")]
    Member {
        /// The row's member, from 1.
        index: usize,
        /// Why the row was refused.
        error: Box<ReplyError>,
    },
}

const NAMES: [&str; ARITY] = [
    "status",
    "server_now_ms",
    "effective_now_ms",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_at_ms",
];

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a bulk string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) => "a status string",
        Value::Okay => "OK",
        Value::ServerError(_) => "an error",
        _ => "a RESP3 value",
    }
}

/// A canonical decimal integer in `0..=2^53-1`: digits only, no sign, no leading zero.
pub(crate) fn decimal(bytes: &[u8]) -> Result<u64, &'static str> {
    if bytes.is_empty() || bytes.len() > 16 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err("not a decimal integer");
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return Err("not a canonical decimal integer (leading zero)");
    }
    let v = bytes
        .iter()
        .fold(0u64, |acc, &b| acc * 10 + u64::from(b - b'0'));
    if v > MAX_SAFE_INTEGER {
        return Err("above 2^53-1");
    }
    Ok(v)
}

pub(crate) fn number(v: &Value) -> Result<u64, &'static str> {
    match v {
        Value::Int(i) if *i < 0 => Err("negative"),
        Value::Int(i) if (*i as u64) > MAX_SAFE_INTEGER => Err("above 2^53-1"),
        Value::Int(i) => Ok(*i as u64),
        // Programs may return numbers as strings (Lua `tostring`) to avoid any float
        // conversion; the text must then be exactly a canonical integer.
        Value::BulkString(b) => decimal(b),
        _ => Err("not an integer"),
    }
}

/// Parses the raw reply of a program.
///
/// # Errors
/// [`ReplyError`] for anything but exactly seven fields with a known status and six
/// integers in `0..=2^53-1`.
/// Whether `value` is an `ALLOWED` reply (the only one that consumed quota, so the only one
/// whose writes `min_replicas_ack` waits for). Cheap: looks at the status field only; the
/// full check is [`parse`].
pub fn is_allowed(value: &Value) -> bool {
    match value {
        Value::Array(fields) => match fields.first() {
            Some(Value::BulkString(b)) => b.as_slice() == b"ALLOWED",
            Some(Value::SimpleString(s)) => s == "ALLOWED",
            _ => false,
        },
        _ => false,
    }
}

/// Whether a raw reply (a single program's or a multi-member one) is a decision, `ALLOWED` or
/// `DENIED`, before any other check.
pub fn is_decision(value: &Value) -> bool {
    match value {
        Value::Array(fields) => match fields.first() {
            Some(Value::BulkString(b)) => matches!(b.as_slice(), b"ALLOWED" | b"DENIED"),
            Some(Value::SimpleString(s)) => matches!(s.as_str(), "ALLOWED" | "DENIED"),
            _ => false,
        },
        _ => false,
    }
}

/// Parses a seven-field reply strictly (shape, status, numbers); [`decide`] then checks it
/// against the policy.
///
/// # Errors
/// [`ReplyError`] for any other shape, an unknown status or a number out of range.
pub fn parse(value: &Value) -> Result<Reply, ReplyError> {
    let fields = match value {
        Value::Array(fields) => fields,
        other => return Err(ReplyError::NotAnArray(kind(other))),
    };
    if fields.len() != ARITY {
        return Err(ReplyError::Arity(fields.len()));
    }
    let status = match &fields[0] {
        Value::BulkString(b) => Status::parse(b).ok_or_else(|| {
            ReplyError::Status(String::from_utf8_lossy(b).chars().take(40).collect())
        })?,
        Value::SimpleString(s) => Status::parse(s.as_bytes())
            .ok_or_else(|| ReplyError::Status(s.chars().take(40).collect()))?,
        _ => {
            return Err(ReplyError::Field {
                index: 0,
                name: NAMES[0],
                problem: "not a string",
            });
        }
    };
    let mut n = [0u64; ARITY - 1];
    for (i, slot) in n.iter_mut().enumerate() {
        *slot = number(&fields[i + 1]).map_err(|problem| ReplyError::Field {
            index: i + 1,
            name: NAMES[i + 1],
            problem,
        })?;
    }
    Ok(Reply {
        status,
        server_now_ms: n[0],
        effective_now_ms: n[1],
        limit: n[2],
        remaining: n[3],
        retry_after_ms: n[4],
        reset_at_ms: n[5],
    })
}

/// What the program's answer means for `policy`.
///
/// # Errors
/// [`ReplyError::Inconsistent`] when an `ALLOWED`/`DENIED` reply contradicts the policy (a
/// limit that is not the policy's, more remaining than the limit, an allow with a retry time,
/// an effective time behind the server time). The caller reports it as `Incompatible(reply)`.
pub fn decide(reply: &Reply, policy: &RateLimitPolicy) -> Result<RateLimitOutcome, ReplyError> {
    let policy_id = policy.id().clone();
    let allowed = match reply.status {
        Status::Allowed => true,
        Status::Denied => false,
        Status::ClockUnsafe => {
            return Ok(RateLimitOutcome::Unavailable {
                policy_id,
                // At least 1 ms: the server clock has to catch up with stored time.
                retry_after_ms: reply.retry_after_ms.max(1),
                category: UnavailableCategory::Clock,
            });
        }
        Status::StateIncompatible => {
            return Ok(RateLimitOutcome::Incompatible {
                policy_id,
                category: IncompatibleCategory::State,
            });
        }
        Status::Invalid => {
            return Ok(RateLimitOutcome::Incompatible {
                policy_id,
                category: IncompatibleCategory::Program,
            });
        }
    };
    let limit = policy.algorithm().limit();
    if reply.limit != limit {
        return Err(ReplyError::Inconsistent("limit is not the policy's"));
    }
    if reply.remaining > limit {
        return Err(ReplyError::Inconsistent("remaining above the limit"));
    }
    if allowed && reply.retry_after_ms != 0 {
        return Err(ReplyError::Inconsistent("an allow with a retry time"));
    }
    if reply.effective_now_ms < reply.server_now_ms {
        return Err(ReplyError::Inconsistent(
            "effective time behind server time",
        ));
    }
    Ok(RateLimitOutcome::Evaluated(RateLimitDecision {
        allowed,
        limit,
        remaining: reply.remaining,
        retry_after_ms: reply.retry_after_ms,
        reset_at_ms: reply.reset_at_ms,
        policy_id,
        revision: policy.revision(),
        source: Source::GlobalRedis,
        certainty: policy.kind().certainty(),
        fleet: None,
    }))
}

/// [`parse`] then [`decide`]; any refusal is `Incompatible(reply)`.
pub fn outcome(value: &Value, policy: &RateLimitPolicy) -> RateLimitOutcome {
    observed(value, policy, |_| {})
}

/// [`outcome`], showing `observe` the parsed reply when it made sense (the provider's clock
/// metrics, `crate::telemetry`); a refused reply is not shown.
pub fn observed(
    value: &Value,
    policy: &RateLimitPolicy,
    observe: impl FnOnce(&Reply),
) -> RateLimitOutcome {
    match parse(value).and_then(|r| decide(&r, policy).inspect(|_| observe(&r))) {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::warn!(policy = %policy.id(), %error, "refused a program reply");
            RateLimitOutcome::Incompatible {
                policy_id: policy.id().clone(),
                category: IncompatibleCategory::Reply,
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use shared_contract::RateLimitPolicy;

    use super::*;

    fn policy() -> RateLimitPolicy {
        RateLimitPolicy::token_bucket("api", 100)
            .refill(10)
            .revision(3)
            .max_cost(10)
            .build()
            .expect("valid policy")
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(status: &str, nums: [i64; 6]) -> Value {
        let mut v = vec![bulk(status)];
        v.extend(nums.iter().map(|&n| Value::Int(n)));
        Value::Array(v)
    }

    const NOW: i64 = 1_764_672_000_123;

    fn incompatible(category: IncompatibleCategory) -> RateLimitOutcome {
        RateLimitOutcome::Incompatible {
            policy_id: policy().id().clone(),
            category,
        }
    }

    #[test]
    fn allowed_reply_becomes_a_global_certain_decision() {
        let out = outcome(
            &reply("ALLOWED", [NOW, NOW, 100, 99, 0, NOW + 100]),
            &policy(),
        );
        let d = out.decision().expect("a decision");
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining, d.retry_after_ms), (100, 99, 0));
        assert_eq!(d.reset_at_ms, (NOW + 100) as u64);
        assert_eq!(d.revision.get(), 3);
        assert_eq!(d.source, Source::GlobalRedis);
    }

    #[test]
    fn denied_reply_is_a_decision_not_an_error() {
        let out = outcome(
            &reply("DENIED", [NOW, NOW, 100, 0, 250, NOW + 9000]),
            &policy(),
        );
        let d = out.decision().expect("a decision");
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 250);
    }

    #[test]
    fn numbers_as_canonical_decimal_strings_are_accepted() {
        let v = Value::Array(vec![
            bulk("DENIED"),
            bulk("1764672000123"),
            bulk("1764672000123"),
            bulk("100"),
            bulk("0"),
            bulk("250"),
            bulk("1764672009000"),
        ]);
        assert_eq!(parse(&v).map(|r| r.remaining), Ok(0));
    }

    #[test]
    fn wrong_arity_is_incompatible_reply() {
        for n in [0usize, 1, 6, 8] {
            let mut v = vec![bulk("ALLOWED")];
            v.extend((1..n).map(|_| Value::Int(1)));
            v.truncate(n);
            assert_eq!(
                outcome(&Value::Array(v), &policy()),
                incompatible(IncompatibleCategory::Reply),
                "{n} fields"
            );
        }
    }

    #[test]
    fn non_array_replies_are_incompatible_reply() {
        for v in [Value::Nil, Value::Int(1), bulk("ALLOWED"), Value::Okay] {
            assert_eq!(
                outcome(&v, &policy()),
                incompatible(IncompatibleCategory::Reply)
            );
        }
    }

    #[test]
    fn unknown_status_is_incompatible_reply_never_allow() {
        for s in ["allowed", "OK", "ALLOW", "ALLOWED ", "", "1"] {
            assert_eq!(
                outcome(&reply(s, [NOW, NOW, 100, 99, 0, NOW]), &policy()),
                incompatible(IncompatibleCategory::Reply),
                "{s:?}"
            );
        }
        let mut v = vec![Value::Int(1)];
        v.extend([NOW, NOW, 100, 99, 0, NOW].map(Value::Int));
        assert_eq!(
            outcome(&Value::Array(v), &policy()),
            incompatible(IncompatibleCategory::Reply)
        );
    }

    #[test]
    fn out_of_range_numbers_are_incompatible_reply() {
        let max = MAX_SAFE_INTEGER as i64;
        for bad in [-1, max + 1, i64::MAX, i64::MIN] {
            for field in 0..6 {
                let mut nums = [NOW, NOW, 100, 99, 0, NOW];
                nums[field] = bad;
                assert_eq!(
                    outcome(&reply("DENIED", nums), &policy()),
                    incompatible(IncompatibleCategory::Reply),
                    "field {field} = {bad}"
                );
            }
        }
    }

    #[test]
    fn malformed_numeric_syntax_is_incompatible_reply() {
        for bad in [
            "",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "01",
            " 1",
            "1 ",
            "0x10",
            "9007199254740992",
            "99999999999999999999",
            "nan",
        ] {
            let v = Value::Array(vec![
                bulk("DENIED"),
                bulk(bad),
                Value::Int(NOW),
                Value::Int(100),
                Value::Int(0),
                Value::Int(1),
                Value::Int(NOW),
            ]);
            assert!(
                matches!(parse(&v), Err(ReplyError::Field { index: 1, .. })),
                "{bad:?}"
            );
        }
        let v = Value::Array(vec![
            bulk("DENIED"),
            Value::Nil,
            Value::Int(NOW),
            Value::Int(100),
            Value::Int(0),
            Value::Int(1),
            Value::Int(NOW),
        ]);
        assert!(parse(&v).is_err());
        assert_eq!(decimal(b"9007199254740991"), Ok(MAX_SAFE_INTEGER));
    }

    #[test]
    fn clock_unsafe_is_unavailable_clock_with_its_retry() {
        let out = outcome(
            &reply("CLOCK_UNSAFE", [NOW, NOW + 5000, 100, 0, 5000, NOW + 5000]),
            &policy(),
        );
        assert_eq!(
            out,
            RateLimitOutcome::Unavailable {
                policy_id: policy().id().clone(),
                retry_after_ms: 5000,
                category: UnavailableCategory::Clock,
            }
        );
    }

    #[test]
    fn state_incompatible_and_invalid_map_to_their_categories() {
        assert_eq!(
            outcome(
                &reply("STATE_INCOMPATIBLE", [NOW, 0, 0, 0, 0, 0]),
                &policy()
            ),
            incompatible(IncompatibleCategory::State)
        );
        assert_eq!(
            outcome(&reply("INVALID", [NOW, 0, 0, 0, 0, 0]), &policy()),
            incompatible(IncompatibleCategory::Program)
        );
    }

    #[test]
    fn replies_contradicting_the_policy_are_incompatible_reply() {
        for nums in [
            [NOW, NOW, 99, 10, 0, NOW],     // another limit
            [NOW, NOW, 100, 101, 0, NOW],   // remaining above limit
            [NOW, NOW, 100, 5, 7, NOW],     // allow with retry
            [NOW, NOW - 1, 100, 5, 0, NOW], // effective behind server time
        ] {
            assert_eq!(
                outcome(&reply("ALLOWED", nums), &policy()),
                incompatible(IncompatibleCategory::Reply),
                "{nums:?}"
            );
        }
    }

    #[test]
    fn only_an_allowed_status_asks_for_replica_acks() {
        assert!(is_allowed(&reply(
            "ALLOWED",
            [NOW, NOW, 100, 99, 0, NOW + 100]
        )));
        assert!(!is_allowed(&reply(
            "DENIED",
            [NOW, NOW, 100, 0, 10, NOW + 100]
        )));
        for v in [Value::Nil, bulk("ALLOWED"), Value::Array(vec![])] {
            assert!(!is_allowed(&v), "{v:?}");
        }
    }
}
