//! One-shot commands to harness nodes, for readiness checks and assertions.
//!
//! Topologies poll their nodes while they come up, fail over and rejoin; a node that is
//! down, paused or still starting must give "no answer yet" quickly instead of hanging the
//! poll or failing the test, so every call here has short timeouts and returns `None`
//! (or an error value) rather than panicking.

use std::time::{Duration, Instant};

/// How long a probe waits to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a probe waits for a reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// `redis://127.0.0.1:PORT`, the URL of a harness node without credentials.
pub fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// A new synchronous connection to `url` (for assertions and planting state).
///
/// # Panics
/// When no connection is made within 5 s; the message names the URL.
pub fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("a connection to the harness node {url}: {e}"))
}

/// Runs one command on a new connection to `url`; `Err` when the node does not answer in
/// time or answers with an error.
pub fn try_query(url: &str, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    con.set_read_timeout(Some(REPLY_TIMEOUT))?;
    con.set_write_timeout(Some(REPLY_TIMEOUT))?;
    let Some((name, rest)) = args.split_first() else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a probe needs a command name",
        )));
    };
    let mut cmd = redis::cmd(name);
    for a in rest {
        cmd.arg(*a);
    }
    cmd.query(&mut con)
}

/// Runs one command on `url`; `None` when the node does not answer or answers an error.
pub fn query(url: &str, args: &[&str]) -> Option<redis::Value> {
    try_query(url, args).ok()
}

/// As [`query`], for commands that answer a string (bulk, verbatim or status).
pub fn query_text(url: &str, args: &[&str]) -> Option<String> {
    text(query(url, args)?)
}

/// The text of a string reply; `None` for any other kind.
pub fn text(value: redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(b) => String::from_utf8(b).ok(),
        redis::Value::VerbatimString { text, .. } => Some(text),
        redis::Value::SimpleString(s) => Some(s),
        redis::Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

/// The value of `field` in an `INFO` text (`role` in `role:master`).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')
            .map(str::trim_end)
    })
}

/// Calls `check` every 50 ms until it returns `Ok` or `deadline` passes; then the last
/// `Err` (the reason the topology is not there yet, for the caller's panic message).
///
/// # Errors
/// The last `Err` of `check` once `deadline` has passed.
pub fn poll_until<T>(
    deadline: Instant,
    check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let within = deadline.saturating_duration_since(Instant::now());
    crate::eventually::poll_blocking(within, Duration::from_millis(50), check)
}

/// Ok when the master at `url` streams its writes to `replicas` replicas: a write and its
/// undo (`SET key`, `DEL key`; `key` must belong to that master, and is gone afterwards),
/// then `WAIT` for their acknowledgement. A replica whose link is "up" may still not receive
/// the stream: after a diskless full sync the master sends it nothing until the replica's
/// first `REPLCONF ACK`, up to a second later, and a master killed in that second loses
/// everything written since. Topologies are "ready" only past that.
pub fn replicas_streaming(url: &str, key: &str, replicas: usize) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
    let mut con = client
        .get_connection_with_timeout(CONNECT_TIMEOUT)
        .map_err(|e| format!("{url}: {e}"))?;
    con.set_read_timeout(Some(REPLY_TIMEOUT))
        .map_err(|e| format!("{url}: {e}"))?;
    let (acked,): (i64,) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg("1")
        .ignore()
        .cmd("DEL")
        .arg(key)
        .ignore()
        .cmd("WAIT")
        .arg(replicas)
        .arg(100)
        .query(&mut con)
        .map_err(|e| format!("{url}: write + WAIT: {e}"))?;
    if usize::try_from(acked).unwrap_or(0) >= replicas {
        Ok(())
    } else {
        Err(format!(
            "{url}: {acked} of {replicas} replicas acknowledged a write (not streaming yet)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "# Replication\r\nrole:slave\r\nmaster_port:7010\r\nmaster_port_x:1\r\n";
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "master_port"), Some("7010"));
        assert_eq!(info_field(info, "master"), None);
    }

    #[test]
    fn string_replies_have_text_and_others_none() {
        assert_eq!(text(redis::Value::Okay).as_deref(), Some("OK"));
        assert_eq!(
            text(redis::Value::BulkString(b"x".to_vec())).as_deref(),
            Some("x")
        );
        assert_eq!(text(redis::Value::Int(1)), None);
    }
}
