//! Failure certainty: what a failed evaluation is known to have done to the shared state.
//!
//! The rule is about *dispatch*, the moment a command is handed to the connection:
//!
//! - **Before dispatch** nothing can have reached the server, so the outcome is
//!   `Unavailable(category)`: no connection (never connected, connection refused, the link's
//!   driver has ended), the admission bound `max_in_flight` reached, or a caller deadline
//!   shorter than `command_timeout` (the provider does not start a command it may have to
//!   abandon). The provider decides these itself, before touching the connection.
//! - **After dispatch**, a transport failure (the command timeout, a reset or closed
//!   connection, a reply that does not parse as RESP) leaves the result unknown: the script
//!   may have run and consumed quota. That is `Indeterminate`. The provider never resends a
//!   command (no driver retry is configured), so each request is dispatched at most once and
//!   `Indeterminate` is honest.
//! - **A server error reply** is an answer: the server says what it did. The codes below are
//!   known to mean "the script did not run" (or, for runtime errors, that it stopped before its
//!   only write: every program validates everything before its single state write, and a
//!   denied `OOM` write is refused before it changes anything). Anything else is treated as
//!   the program being unusable here: `Incompatible(program)`, never an allow.
//!
//! | reply | outcome | why |
//! | --- | --- | --- |
//! | `NOSCRIPT` | reload: `EVAL` of the exact source | script cache flushed or server restarted |
//! | `LOADING` | `Unavailable(server)` | dataset still loading; nothing runs |
//! | `BUSY` | `Unavailable(server)` | another script is running too long; nothing runs |
//! | `OOM` | `Unavailable(server)` | `maxmemory` with `noeviction` refuses the write |
//! | `READONLY` | `Unavailable(server)` | connected to a replica; writes refused |
//! | `MASTERDOWN`, `NOREPLICAS`, `MISCONF` | `Unavailable(server)` | writes refused by replication / persistence guards |
//! | `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK` | `Unavailable(server)` | cluster did not run it here |
//! | `NOPERM`, `NOAUTH`, `WRONGPASS` | `Incompatible(program)` | ACL forbids the program or its key |
//! | `ERR` and unknown codes | `Incompatible(program)` | unknown command, script runtime error, version mismatch |

use redis::Value;
use shared_contract::{IncompatibleCategory, UnavailableCategory};

use crate::wire::WireError;

/// How a failed command is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server does not have the script: send its exact source with `EVAL`.
    NoScript,
    /// Known not to have run.
    Unavailable(UnavailableCategory),
    /// Dispatched, result unknown.
    Indeterminate,
    /// The server refused the program.
    Incompatible(IncompatibleCategory),
}

/// The meaning of a server error reply, by its code (the first word of the error line).
pub fn server_error(code: &str) -> Failure {
    match code {
        "NOSCRIPT" => Failure::NoScript,
        "LOADING" | "BUSY" | "OOM" | "READONLY" | "MASTERDOWN" | "NOREPLICAS" | "MISCONF"
        | "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK" => {
            Failure::Unavailable(UnavailableCategory::Server)
        }
        _ => Failure::Incompatible(IncompatibleCategory::Program),
    }
}

/// A reply value, or what it means when it is an error reply.
pub(crate) fn of_reply(value: Value) -> Result<Value, Failure> {
    match value {
        Value::ServerError(e) => Err(server_error(e.code())),
        value => Ok(value),
    }
}

/// What a call that got no reply means: known not sent (the connection had already ended) is
/// `Unavailable(connect)`; lost after it was queued (a reset, a closed connection, a reply
/// that does not parse), `Indeterminate`.
pub(crate) fn transport(e: &WireError) -> Failure {
    match e {
        WireError::NotSent(_) => Failure::Unavailable(UnavailableCategory::Connect),
        WireError::Lost(_) => {
            tracing::debug!(error = %e, "command failed after dispatch");
            Failure::Indeterminate
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noscript_asks_for_a_reload() {
        assert_eq!(server_error("NOSCRIPT"), Failure::NoScript);
    }

    #[test]
    fn refusals_before_running_are_unavailable_server() {
        for code in [
            "LOADING",
            "BUSY",
            "OOM",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "MOVED",
        ] {
            assert_eq!(
                server_error(code),
                Failure::Unavailable(UnavailableCategory::Server),
                "{code}"
            );
        }
    }

    #[test]
    fn permission_and_unknown_errors_are_incompatible_program() {
        for code in ["NOPERM", "NOAUTH", "ERR", "WRONGTYPE", "SOMETHINGNEW"] {
            assert_eq!(
                server_error(code),
                Failure::Incompatible(IncompatibleCategory::Program),
                "{code}"
            );
        }
    }

    #[test]
    fn transport_errors_after_dispatch_are_indeterminate() {
        for why in [
            "reset by peer",
            "the server closed the connection",
            "unreadable reply",
        ] {
            assert_eq!(
                transport(&WireError::Lost(why.into())),
                Failure::Indeterminate,
                "{why}"
            );
        }
        // Before dispatch nothing reached the server.
        assert_eq!(
            transport(&WireError::NotSent("closed".into())),
            Failure::Unavailable(UnavailableCategory::Connect)
        );
    }

    #[test]
    fn error_replies_are_failures_and_other_replies_values() {
        let moved = redis::parse_redis_value(b"-MOVED 1 127.0.0.1:7001\r\n").expect("error reply");
        assert_eq!(
            of_reply(moved),
            Err(Failure::Unavailable(UnavailableCategory::Server))
        );
        assert_eq!(of_reply(Value::Int(1)), Ok(Value::Int(1)));
    }
}
