//! RESP2, the Redis wire format: commands encoded as arrays of bulk strings, and a parser for
//! exactly the reply frames Redis sends. Pure: bytes in, values out, no I/O, so every frame,
//! cut and malformation is tested on byte strings here (the way redis-rs tests its parser);
//! the connection in [`crate::wire`] only feeds it what the socket gave.

use redis::Value;

/// Nesting beyond this is refused (the deepest reply read here, `CLUSTER SLOTS`, has 3).
const MAX_DEPTH: usize = 16;

/// Most elements an array reserves room for before they arrive; a longer one grows as they
/// do. Without the bound, each unfinished level of a nested array announcing a huge length
/// reserved room for all the bytes that followed, one value (56 bytes) per 3 bytes, at every
/// level at once: 16 levels over 4 MiB of input held over 1 GiB.
const MAX_RESERVED_ITEMS: usize = 1024;

/// Appends a RESP array header.
pub(crate) fn write_array(out: &mut Vec<u8>, len: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a RESP bulk string.
pub(crate) fn write_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends an integer as a RESP bulk string (how Redis takes every argument).
pub(crate) fn write_bulk_u64(out: &mut Vec<u8>, n: u64) {
    write_bulk(out, itoa::Buffer::new().format(n).as_bytes());
}

/// Why bytes are not a RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    #[error("unknown frame type {0:?}")]
    Type(char),
    #[error("bad length or integer {0:?}")]
    Number(String),
    #[error("line or bulk string not terminated by CRLF")]
    Terminator,
    #[error("nested deeper than {MAX_DEPTH}")]
    Depth,
    #[error("error reply: {0}")]
    Error(String),
}

/// One complete reply at the start of `bytes` and how many bytes it took, or `None` when more
/// bytes are needed.
///
/// # Errors
/// [`ParseError`] when the bytes are not RESP2.
pub(crate) fn parse(bytes: &[u8]) -> Result<Option<(Value, usize)>, ParseError> {
    parse_at(bytes, 0)
}

fn parse_at(bytes: &[u8], depth: usize) -> Result<Option<(Value, usize)>, ParseError> {
    if depth > MAX_DEPTH {
        return Err(ParseError::Depth);
    }
    let Some((&kind, rest)) = bytes.split_first() else {
        return Ok(None);
    };
    // RESP lines hold no CR: the first one ends the line.
    let Some(eol) = rest.iter().position(|&b| b == b'\r') else {
        return Ok(None);
    };
    match rest.get(eol + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(ParseError::Terminator),
    }
    let line = &rest[..eol];
    let after_line = 1 + eol + 2;
    match kind {
        b'+' => {
            let value = if line == b"OK" {
                Value::Okay
            } else {
                Value::SimpleString(String::from_utf8_lossy(line).into_owned())
            };
            Ok(Some((value, after_line)))
        }
        b'-' => {
            // Rare: the driver's own parser builds its error type (codes, details).
            let value = redis::parse_redis_value(&bytes[..after_line])
                .map_err(|e| ParseError::Error(e.to_string()))?;
            Ok(Some((value, after_line)))
        }
        b':' => Ok(Some((Value::Int(integer(line)?), after_line))),
        b'$' => {
            let len = integer(line)?;
            if len == -1 {
                return Ok(Some((Value::Nil, after_line)));
            }
            let len = usize::try_from(len).map_err(|_| number(line))?;
            let end = after_line + len;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(ParseError::Terminator);
            }
            Ok(Some((
                Value::BulkString(bytes[after_line..end].to_vec()),
                end + 2,
            )))
        }
        b'*' => {
            let len = integer(line)?;
            if len == -1 {
                return Ok(Some((Value::Nil, after_line)));
            }
            let len = usize::try_from(len).map_err(|_| number(line))?;
            // Every element takes at least 3 bytes: no allocation beyond what arrived, and
            // at most `MAX_RESERVED_ITEMS` ahead of it.
            let arrived = (bytes.len() - after_line) / 3;
            let mut items = Vec::with_capacity(len.min(arrived).min(MAX_RESERVED_ITEMS));
            let mut at = after_line;
            for _ in 0..len {
                match parse_at(&bytes[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(items), at)))
        }
        other => Err(ParseError::Type(char::from(other))),
    }
}

fn number(line: &[u8]) -> ParseError {
    ParseError::Number(String::from_utf8_lossy(line).into_owned())
}

/// A RESP integer line: an optional `-`, then 1 to 19 digits, within `i64`.
fn integer(line: &[u8]) -> Result<i64, ParseError> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(number(line));
    }
    let mut magnitude: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(number(line));
        }
        magnitude = magnitude * 10 + u64::from(d - b'0');
    }
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
    .ok_or_else(|| number(line))
}

/// The text of a bulk, simple or verbatim string reply.
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        match parse(bytes) {
            Ok(Some((v, used))) => {
                assert_eq!(used, bytes.len(), "{bytes:?}");
                v
            }
            other => panic!("{bytes:?}: {other:?}"),
        }
    }

    #[test]
    fn parses_every_resp2_frame() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".to_owned()));
        assert_eq!(whole(b":-42\r\n"), Value::Int(-42));
        assert_eq!(whole(b":0\r\n"), Value::Int(0));
        assert_eq!(whole(b":9223372036854775807\r\n"), Value::Int(i64::MAX));
        assert_eq!(whole(b":-9223372036854775808\r\n"), Value::Int(i64::MIN));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(Vec::new()));
        assert_eq!(
            whole(b"$4\r\na\r\nb\r\n"),
            Value::BulkString(b"a\r\nb".to_vec())
        );
        assert_eq!(
            whole(b"*2\r\n*1\r\n:1\r\n$2\r\nhi\r\n"),
            Value::Array(vec![
                Value::Array(vec![Value::Int(1)]),
                Value::BulkString(b"hi".to_vec())
            ])
        );
    }

    #[test]
    fn error_replies_keep_their_code_and_details() {
        match whole(b"-MOVED 3999 127.0.0.1:6381\r\n") {
            Value::ServerError(e) => {
                assert_eq!(e.code(), "MOVED");
                assert_eq!(e.details(), Some("3999 127.0.0.1:6381"));
            }
            other => panic!("{other:?}"),
        }
        match whole(b"-NOSCRIPT No matching script.\r\n") {
            Value::ServerError(e) => assert_eq!(e.code(), "NOSCRIPT"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_cut_anywhere_needs_more_bytes() {
        let reply = b"*7\r\n$7\r\nALLOWED\r\n$13\r\n1700000000000\r\n$13\r\n1700000000000\r\n$2\r\n10\r\n$1\r\n9\r\n$1\r\n0\r\n$13\r\n1700000001000\r\n";
        for cut in 0..reply.len() {
            assert_eq!(parse(&reply[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = reply.to_vec();
        two.extend_from_slice(b":1\r\n");
        let (first, used) = parse(&two).ok().flatten().expect("a whole reply");
        assert_eq!(used, reply.len());
        assert!(matches!(first, Value::Array(ref items) if items.len() == 7));
        assert_eq!(parse(&two[used..]), Ok(Some((Value::Int(1), 4))));
    }

    #[test]
    fn malformed_replies_are_refused() {
        assert_eq!(parse(b"%1\r\n"), Err(ParseError::Type('%')));
        assert!(matches!(parse(b":12a\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b"$-2\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b"*x\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":-\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b":+1\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(
            parse(b":9223372036854775808\r\n"),
            Err(ParseError::Number(_))
        ));
        assert!(matches!(
            parse(b":99999999999999999999\r\n"),
            Err(ParseError::Number(_))
        ));
        assert_eq!(parse(b"$2\r\nabcd\r\n"), Err(ParseError::Terminator));
        assert_eq!(parse(b"+a\rb\r\n"), Err(ParseError::Terminator));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert_eq!(parse(deep.as_bytes()), Err(ParseError::Depth));
    }

    #[test]
    fn a_huge_announced_array_allocates_only_for_what_arrived() {
        assert_eq!(parse(b"*9223372036854775807\r\n:1\r\n"), Ok(None));
    }

    #[test]
    fn commands_encode_as_resp_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        write_array(&mut out, 3);
        write_bulk(&mut out, b"EVALSHA");
        write_bulk_u64(&mut out, 1234);
        write_bulk(&mut out, b"");
        assert_eq!(out, b"*3\r\n$7\r\nEVALSHA\r\n$4\r\n1234\r\n$0\r\n\r\n");
        let mut packed = Vec::new();
        redis::cmd("EVALSHA")
            .arg(1234)
            .arg("")
            .write_packed_command(&mut packed);
        assert_eq!(out, packed, "same bytes as the driver's encoder");
    }

    #[test]
    fn nothing_or_a_partial_frame_needs_more_bytes() {
        for partial in [
            &b""[..],
            b"+",
            b"+OK",
            b"+OK\r",
            b":12",
            b"$3\r\nab",
            b"$3\r\nabc\r",
            b"*2\r\n:1\r\n",
            b"*2\r\n*1\r\n",
        ] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn nested_arrays_parse_at_every_depth_up_to_the_bound() {
        let mut nested = "*1\r\n".repeat(MAX_DEPTH);
        nested.push_str(":7\r\n");
        let mut want = Value::Int(7);
        for _ in 0..MAX_DEPTH {
            want = Value::Array(vec![want]);
        }
        assert_eq!(whole(nested.as_bytes()), want);
        // Cut anywhere, a nested reply is incomplete, never wrong.
        let reply = b"*3\r\n*2\r\n$1\r\na\r\n:-1\r\n*0\r\n*1\r\n$-1\r\n";
        for cut in 0..reply.len() {
            assert_eq!(parse(&reply[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(
            whole(reply),
            Value::Array(vec![
                Value::Array(vec![Value::BulkString(b"a".to_vec()), Value::Int(-1)]),
                Value::Array(vec![]),
                Value::Array(vec![Value::Nil]),
            ])
        );
    }

    #[test]
    fn a_bulk_string_longer_or_shorter_than_announced_is_refused() {
        // Three bytes announced, two and a CRLF sent, then more: the terminator is misplaced.
        assert_eq!(parse(b"$3\r\nab\r\nX"), Err(ParseError::Terminator));
        assert_eq!(parse(b"$1\r\nab\r\n"), Err(ParseError::Terminator));
        // Only -1 is a null; other negative lengths are not lengths.
        assert!(matches!(parse(b"*-2\r\n"), Err(ParseError::Number(_))));
        assert!(matches!(parse(b"$ 1\r\nx\r\n"), Err(ParseError::Number(_))));
    }

    #[test]
    fn error_replies_inside_arrays_stay_values() {
        match whole(b"*2\r\n-ERR unknown command\r\n:1\r\n") {
            Value::Array(items) => {
                assert!(
                    matches!(&items[0], Value::ServerError(e) if e.code() == "ERR"),
                    "{items:?}"
                );
                assert_eq!(items[1], Value::Int(1));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn text_reads_every_string_reply_and_nothing_else() {
        assert_eq!(
            text(&Value::BulkString(b"a".to_vec())),
            Some("a".to_owned())
        );
        assert_eq!(
            text(&Value::SimpleString("b".to_owned())),
            Some("b".to_owned())
        );
        assert_eq!(text(&Value::Int(1)), None);
        assert_eq!(text(&Value::Nil), None);
    }
}
