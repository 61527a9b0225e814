//! Fuzzing the RESP2 reply parser (the bytes a server, or anything listening on its port,
//! sends): arbitrary bytes, valid frames cut anywhere or with one byte changed, and frames
//! announcing huge lengths. The parser never panics, never claims more bytes than it was
//! given, and allocates in proportion to the bytes that arrived, never to a length a frame
//! announces.
//!
//! Each property runs a bounded number of cases in `cargo test`; `FUZZ_CASES=N` runs `N`.

use std::time::{Duration, Instant};

use adapter_redis::fuzzing::parse_resp;
use proptest::prelude::*;
use redis::Value;

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default_cases))
}

fn server_error(text: &str) -> Value {
    redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply")
}

/// RESP2 reply values, as a server sends them.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::BulkString),
        "[a-zA-Z0-9 _.:-]{0,20}"
            .prop_filter("OK parses as Okay", |s| s != "OK")
            .prop_map(Value::SimpleString),
        "(ERR|NOSCRIPT|BUSY|WRONGTYPE) [a-z0-9.:]{1,20}".prop_map(|s| server_error(&s)),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(Value::Array)
    })
}

fn encode(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Okay => out.extend_from_slice(b"+OK\r\n"),
        Value::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Value::BulkString(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::SimpleString(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::ServerError(e) => {
            let details = e.details().map(|d| format!(" {d}")).unwrap_or_default();
            out.extend_from_slice(format!("-{}{details}\r\n", e.code()).as_bytes());
        }
        Value::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                encode(item, out);
            }
        }
        other => unreachable!("not generated: {other:?}"),
    }
}

fn encoded(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(v, &mut out);
    out
}

/// Lengths a hostile frame may announce: far beyond memory, at the integer bounds, or merely
/// more than what follows.
fn huge_length() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1_099_511_627_776),
        Just(i64::MAX),
        Just(i64::MAX - 1),
        Just(u32::MAX as i64),
        1_000i64..i64::MAX,
    ]
}

/// Parses `bytes`, checks that the answer is sane and the work bounded, and returns it.
type Parsed = Result<Option<(Value, usize)>, String>;

fn parse_checked(bytes: &[u8]) -> Result<Parsed, TestCaseError> {
    let start = Instant::now();
    let parsed = parse_resp(bytes);
    let took = start.elapsed();
    prop_assert!(
        took < Duration::from_secs(1),
        "parsing {} bytes took {took:?}",
        bytes.len()
    );
    if let Ok(Some((_, used))) = &parsed {
        prop_assert!(
            *used > 0 && *used <= bytes.len(),
            "used {used} of {}",
            bytes.len()
        );
    }
    Ok(parsed)
}

// Cheap cases (one parse of at most a few KiB each): many.
proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_checked(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_after_a_frame_type_never_panic(
        kind in prop::sample::select(b"+-:$*%_#,(=>~|!".to_vec()),
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        // Mostly the bytes frames are made of, so that lines, lengths and nesting occur.
        const FRAME_BYTES: &[u8] = b"\r\n\r\n-*$:+0123456789";
        let mut frame = vec![kind];
        frame.extend(bytes.iter().map(|&b| match FRAME_BYTES.get(usize::from(b % 32)) {
            Some(&f) => f,
            None => b,
        }));
        let _ = parse_checked(&frame)?;
    }

    #[test]
    fn a_huge_announced_length_allocates_only_for_what_arrived(
        kind in prop::sample::select(b"$*".to_vec()),
        len in huge_length(),
        tail in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            (0usize..4096).prop_map(|n| b":1\r\n".repeat(n)),
            (0usize..4096).prop_map(|n| vec![b'x'; n]),
        ],
    ) {
        let mut frame = format!("{}{len}\r\n", char::from(kind)).into_bytes();
        frame.extend_from_slice(&tail);
        let _ = parse_checked(&frame)?;
    }
}

// A parse per cut of a reply, or a 64 KiB frame: fewer.
proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn a_valid_reply_parses_whole_and_every_cut_needs_more(v in value(), junk in prop::collection::vec(any::<u8>(), 0..16)) {
        let bytes = encoded(&v);
        let parsed = parse_checked(&bytes)?;
        prop_assert_eq!(parsed, Ok(Some((v.clone(), bytes.len()))));
        for cut in 0..bytes.len() {
            prop_assert_eq!(parse_checked(&bytes[..cut])?, Ok(None), "cut at {}", cut);
        }
        // What follows a reply is the next reply's: never read as part of this one.
        let mut more = bytes.clone();
        more.extend_from_slice(&junk);
        prop_assert_eq!(parse_checked(&more)?, Ok(Some((v, bytes.len()))));
    }

    #[test]
    fn a_valid_reply_with_one_byte_changed_never_panics(
        v in value(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        edit in 0u8..3,
    ) {
        let mut bytes = encoded(&v);
        let i = at.index(bytes.len());
        match edit {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            _ => {
                bytes.remove(i);
            }
        }
        let _ = parse_checked(&bytes)?;
    }

    #[test]
    fn nested_huge_arrays_allocate_only_for_what_arrived(
        depth in 1usize..=16,
        len in huge_length(),
        tail_kib in 1usize..64,
    ) {
        // Every level announces a huge array; the innermost gets a bulk string that never
        // ends, so no level completes and all are alive at once.
        let mut frame = format!("*{len}\r\n").repeat(depth).into_bytes();
        frame.extend_from_slice(format!("${len}\r\n").as_bytes());
        frame.resize(frame.len() + (tail_kib << 10), b'x');
        prop_assert_eq!(parse_checked(&frame)?, Ok(None));
    }
}

#[test]
fn the_announced_lengths_of_the_issue_need_more_bytes() {
    for frame in [&b"*1099511627776\r\n"[..], b"$1099511627776\r\n"] {
        assert_eq!(parse_resp(frame), Ok(None), "{frame:?}");
    }
}
