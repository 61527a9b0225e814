//! Fuzzing the reply parsers of the rate-limit and gate programs with arbitrary
//! [`redis::Value`] trees (every RESP2 and RESP3 variant) and with valid replies that had one
//! field replaced. They never panic, and an answer that grants something (an allow, a
//! submission, a duplicate) comes only from a reply that says exactly that: the right arity,
//! the status, and numbers that are integers in `0..=2^53-1` agreeing with the settings.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use std::time::Duration;

use adapter_redis::gate::reply as gate_reply;
use adapter_redis::reply;
use proptest::prelude::*;
use redis::{PushKind, Value, VerbatimFormat};
use shared_contract::exact::MAX_SAFE_INTEGER;
use shared_contract::gate::{
    EventId, GateClock, GateId, GateMode, GateOutcome, GateSettings, GateSpec, SubmitOutcome,
};
use shared_contract::{
    AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitOutcome,
    RateLimitPolicy,
};

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

const LIMIT: u64 = 100;
const DURATION_MS: u64 = 3_000;

fn policy() -> RateLimitPolicy {
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("api").expect("valid id"),
        revision: PolicyRevision::new(1).expect("valid revision"),
        algorithm: AlgorithmSpec::FixedWindow {
            limit: LIMIT,
            window: Duration::from_secs(60),
        },
        max_cost: 10,
        cleanup_grace: Duration::from_secs(60),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("valid policy")
}

fn gate() -> GateSettings {
    let id = GateId::new("g").expect("valid gate id");
    GateSettings::new(GateSpec::new(
        id,
        GateMode::OnlyOnce,
        Duration::from_millis(DURATION_MS),
    ))
    .expect("valid gate")
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

/// Text that is often a status, a number or a record, and sometimes anything.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "ALLOWED",
            "DENIED",
            "CLOCK_UNSAFE",
            "STATE_INCOMPATIBLE",
            "INVALID",
            "SUBMITTED",
            "REJECTED",
            "DUPLICATE",
            "FULL",
            "CLOCK_EXHAUSTED",
            "PUBLISHED",
            "SWEPT",
            "SNAPSHOT",
            "UPDATES",
            "s",
            "i",
            "k",
            "a",
            "p",
            "S",
            "P",
            "I",
            "1-0",
            "0",
            "100",
            "3000",
            "007",
            "-1",
            "9007199254740992",
            "9007199254740991",
            "",
        ])
        .prop_map(str::to_owned),
        "[0-9]{1,20}",
        "[SPI]:[0-9]{1,3}:[0-9]{1,4}:[0-9]{1,4}:[0-9]{0,4}:[a-z]{0,5}",
        "[0-9]{1,5}-[0-9]",
        any::<String>(),
    ]
}

/// Any reply value: every RESP2 and RESP3 variant, nested.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        prop_oneof![
            any::<i64>(),
            0i64..=200,
            Just(MAX_SAFE_INTEGER as i64),
            Just(MAX_SAFE_INTEGER as i64 + 1)
        ]
        .prop_map(Value::Int),
        text().prop_map(|s| bulk(&s)),
        prop::collection::vec(any::<u8>(), 0..12).prop_map(Value::BulkString),
        text().prop_map(Value::SimpleString),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
        text().prop_map(|text| Value::VerbatimString {
            format: VerbatimFormat::Text,
            text,
        }),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Value::BigNumber),
        Just(redis::parse_redis_value(b"-ERR no\r\n").expect("an error reply")),
    ];
    leaf.prop_recursive(4, 48, 11, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..11).prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            prop::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(Value::Map),
            prop::collection::vec(inner.clone(), 0..3).prop_map(|data| Value::Push {
                kind: PushKind::Message,
                data,
            }),
            (
                inner.clone(),
                prop::collection::vec((inner.clone(), inner), 0..2)
            )
                .prop_map(|(data, attributes)| Value::Attribute {
                    data: Box::new(data),
                    attributes,
                }),
        ]
    })
}

/// Whether `v` is exactly the number `n` as a program writes it: an integer, or its canonical
/// decimal text.
fn is_number(v: &Value, n: u64) -> bool {
    match v {
        Value::Int(i) => u64::try_from(*i) == Ok(n),
        Value::BulkString(b) => *b == n.to_string().into_bytes(),
        _ => false,
    }
}

fn is_status(v: &Value, status: &str) -> bool {
    match v {
        Value::BulkString(b) => b.as_slice() == status.as_bytes(),
        Value::SimpleString(s) => s == status,
        _ => false,
    }
}

/// A rate-limit allow comes only from a reply that says exactly that allow.
fn check_rate(v: &Value) -> Result<(), TestCaseError> {
    let outcome = reply::outcome(v, &policy());
    let _ = reply::is_allowed(v);
    if let RateLimitOutcome::Evaluated(d) = &outcome {
        let Value::Array(f) = v else {
            return Err(TestCaseError::fail(format!("a decision from {v:?}")));
        };
        prop_assert_eq!(f.len(), 7, "{:?}", v);
        prop_assert!(
            is_status(&f[0], if d.allowed { "ALLOWED" } else { "DENIED" }),
            "{:?}",
            v
        );
        prop_assert!(
            is_number(&f[3], LIMIT) && is_number(&f[4], d.remaining),
            "{:?}",
            v
        );
        prop_assert!(
            is_number(&f[5], d.retry_after_ms) && is_number(&f[6], d.reset_at_ms),
            "{:?}",
            v
        );
        prop_assert!(d.remaining <= LIMIT, "{:?}", v);
        if d.allowed {
            prop_assert!(reply::is_allowed(v) && d.retry_after_ms == 0, "{:?}", v);
        }
    }
    Ok(())
}

/// A submission or duplicate comes only from a reply of seven fields that says so.
fn check_gate(v: &Value) -> Result<(), TestCaseError> {
    let id = EventId::new("e1").expect("valid id");
    let batch = 8;
    match gate_reply::submit(v, &gate(), &id) {
        Ok(GateOutcome::Evaluated(SubmitOutcome::Submitted { publish_at_ms, .. })) => {
            let Value::Array(f) = v else {
                return Err(TestCaseError::fail(format!("a submission from {v:?}")));
            };
            prop_assert!(f.len() == 7 && is_status(&f[0], "SUBMITTED"), "{:?}", v);
            prop_assert!(is_number(&f[4], publish_at_ms), "{:?}", v);
            let effective = publish_at_ms.checked_sub(DURATION_MS);
            prop_assert!(effective.is_some_and(|e| is_number(&f[2], e)), "{:?}", v);
        }
        Ok(GateOutcome::Evaluated(SubmitOutcome::Duplicate(r))) => {
            let Value::Array(f) = v else {
                return Err(TestCaseError::fail(format!("a duplicate from {v:?}")));
            };
            prop_assert!(f.len() == 7 && is_status(&f[0], "DUPLICATE"), "{:?}", v);
            prop_assert!(is_number(&f[3], r.clock.get()), "{:?}", v);
        }
        _ => {}
    }
    let _ = gate_reply::publish(v, batch);
    let _ = gate_reply::sweep(v, batch);
    let _ = gate_reply::snapshot(v);
    let _ = gate_reply::entry(v);
    let _ = gate_reply::updates(v, GateClock::ZERO, batch);
    if let Value::BulkString(raw) = v {
        let _ = gate_reply::record(&id, raw);
    }
    Ok(())
}

/// A valid reply of each kind, to replace one field of.
fn valid_replies() -> Vec<Value> {
    let n = |x: u64| Value::Int(x as i64);
    vec![
        Value::Array(vec![
            bulk("ALLOWED"),
            n(1_000),
            n(1_000),
            n(LIMIT),
            n(99),
            n(0),
            n(61_000),
        ]),
        Value::Array(vec![
            bulk("DENIED"),
            n(1_000),
            n(1_000),
            n(LIMIT),
            n(0),
            n(500),
            n(61_000),
        ]),
        Value::Array(vec![
            bulk("SUBMITTED"),
            n(1_000),
            n(1_000),
            n(7),
            n(1_000 + DURATION_MS),
            n(0),
            Value::Nil,
        ]),
        Value::Array(vec![
            bulk("DUPLICATE"),
            n(1_000),
            n(1_000),
            n(7),
            n(4_000),
            n(0),
            bulk("S:7:1000:4000::alpha"),
        ]),
        Value::Array(vec![
            bulk("PUBLISHED"),
            n(1),
            n(1),
            n(9),
            n(2),
            n(0),
            n(5_000),
        ]),
        Value::Array(vec![
            bulk("SNAPSHOT"),
            n(9),
            Value::Array(vec![bulk("e1"), bulk("S:7:1000:4000::alpha")]),
        ]),
        Value::Array(vec![
            bulk("UPDATES"),
            n(9),
            n(0),
            Value::Array(vec![Value::Array(vec![
                bulk("8-0"),
                Value::Array(
                    ["s", "P", "i", "e1", "k", "alpha", "a", "4000", "p", "4000"]
                        .map(bulk)
                        .to_vec(),
                ),
            ])]),
        ]),
    ]
}

/// `v` with the value at `path` (indices into nested arrays) replaced by `with`.
fn replaced(v: &Value, path: &[prop::sample::Index], with: &Value) -> Value {
    match (v, path.split_first()) {
        (Value::Array(items), Some((i, rest))) if !items.is_empty() => {
            let at = i.index(items.len());
            let mut items = items.clone();
            items[at] = replaced(&items[at], rest, with);
            Value::Array(items)
        }
        _ => with.clone(),
    }
}

proptest! {
    #![proptest_config(config(1_000))]

    #[test]
    fn arbitrary_values_never_panic_and_never_grant(v in value()) {
        check_rate(&v)?;
        check_gate(&v)?;
    }

    #[test]
    fn a_valid_reply_with_one_field_replaced_never_grants_what_it_does_not_say(
        which in any::<prop::sample::Index>(),
        path in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        with in value(),
    ) {
        let replies = valid_replies();
        let v = replaced(&replies[which.index(replies.len())], &path, &with);
        check_rate(&v)?;
        check_gate(&v)?;
    }
}

#[test]
fn the_valid_replies_grant_what_they_say() {
    let replies = valid_replies();
    assert!(
        reply::outcome(&replies[0], &policy())
            .decision()
            .is_some_and(|d| d.allowed)
    );
    let id = EventId::new("e1").expect("valid id");
    assert!(matches!(
        gate_reply::submit(&replies[2], &gate(), &id),
        Ok(GateOutcome::Evaluated(SubmitOutcome::Submitted { .. }))
    ));
    assert!(matches!(
        gate_reply::submit(&replies[3], &gate(), &id),
        Ok(GateOutcome::Evaluated(SubmitOutcome::Duplicate(_)))
    ));
    assert!(matches!(
        gate_reply::snapshot(&replies[5]),
        Ok(GateOutcome::Evaluated(_))
    ));
    assert!(matches!(
        gate_reply::updates(&replies[6], GateClock::ZERO, 8),
        Ok(GateOutcome::Evaluated(_))
    ));
}
