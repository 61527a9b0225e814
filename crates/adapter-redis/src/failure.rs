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

use redis::{ErrorKind, RedisError};
use shared_contract::{IncompatibleCategory, UnavailableCategory};

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

/// The meaning of a driver error returned for a command that was dispatched.
pub fn after_dispatch(error: &RedisError) -> Failure {
    match error.kind() {
        // An error reply from the server: it answered, so its code says what happened.
        ErrorKind::Server(_) | ErrorKind::Extension => match error.code() {
            Some(code) => server_error(code),
            None => Failure::Indeterminate,
        },
        // Everything else (I/O, closed connection, unparsable reply, client-side errors raised
        // after the command was queued) leaves the server's side unknown.
        _ => Failure::Indeterminate,
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
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by peer",
        ));
        assert_eq!(after_dispatch(&io), Failure::Indeterminate);
        let eof = RedisError::from(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        assert_eq!(after_dispatch(&eof), Failure::Indeterminate);
        let parse = RedisError::from((ErrorKind::Parse, "garbled"));
        assert_eq!(after_dispatch(&parse), Failure::Indeterminate);
    }
}
