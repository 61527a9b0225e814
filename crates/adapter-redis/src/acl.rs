//! The start-up ACL check: before a new connection is used, ask the server whether the
//! configured ACL user may run every command the provider needs, on the provider's keys.
//!
//! ## Why at start-up
//!
//! Redis checks ACL rules for every `redis.call` inside a script, and a denied call is an `ERR`
//! raised *in the middle* of the script: writes made before it stay (there is no rollback).
//! Discovered at the first request, a missing `+xadd` would leave a gate's event half
//! submitted, and a missing `+set` would be found only by the first request that needed it.
//! Checked here, a user that lacks anything makes the connection `Incompatible`: no program
//! runs, every evaluation is `Incompatible(program)` and `readiness()` names what is missing
//! and the ACL rule that grants it. The supervisor re-checks now and then, so a fixed user is
//! picked up without a restart.
//!
//! ## How
//!
//! `lua/acl-check-v1.lua` calls `redis.acl_check_cmd` (Redis >= 7.0) once per [`Command`]
//! with a probe of the real command's shape (key positions included; the key is a probe key
//! under the provider's prefix, never touched) and answers one verdict per probe. It is sent
//! with `EVAL`, which the provider needs anyway; when `EVAL` itself is refused the check
//! cannot run, and that is the answer (`Incompatible`, naming `EVAL`/`EVALSHA`).
//!
//! What to check is derived, not listed: each program's [`Script`] declares the commands its
//! source calls (a unit test of each program list parses every source and holds the
//! declarations to it); `Needs` takes the program lists a provider runs, and adds the
//! commands the provider sends itself (`EVALSHA`, `EVAL`, `PING`, the gate provider's
//! `HGET`). Optional commands (`INFO`, `CONFIG GET`, `SCRIPT LOAD`) are not checked:
//! the provider skips what they serve when they are refused.
//!
//! A check that fails in transit leaves the connection down (retried like any failed
//! connect); a reply this build does not understand is `Incompatible`: never "permitted".

use std::fmt::Write as _;

use redis::Value;

use crate::commands::{CLUSTER_SLOTS, Command, EVAL, EVALSHA, HGET, PING, WAIT};
use crate::dial::Attempt;
use crate::failure::{self, Failure};
use crate::script::{Script, embedded};
use crate::settings::{RedisSettings, Topology};
use crate::wire::Conn;

/// The check program (read only, no keys): see its header in `lua/`.
pub static CHECK_PROGRAM: Script = embedded!("acl-check-v1.lua", &[]);

/// One command a provider needs and who needs it (program file names, or what the provider
/// sends it for), for the message that names the fix.
#[derive(Debug)]
struct Need {
    command: &'static Command,
    used_by: Vec<&'static str>,
}

/// What one provider needs the ACL user to be allowed: every command, on keys under its
/// prefix. Built once per provider and checked on every new connection.
#[derive(Debug)]
pub(crate) struct Needs {
    /// The key pattern a least-privilege user is given, `<prefix>:*`, for messages.
    pattern: String,
    /// A key of the provider's layout under its prefix; only ever probed, never touched.
    probe_key: String,
    needs: Vec<Need>,
}

impl Needs {
    /// The rate-limit provider: its `programs` (every algorithm: policies can change on a
    /// restart, the user should not have to), `EVALSHA`, `EVAL` and `PING`.
    pub(crate) fn rate(prefix: &str, programs: &[&'static Script]) -> Self {
        let programs = programs.iter().map(|p| (p.name, p.commands));
        Self::new(
            format!("{prefix}:*"),
            format!("{prefix}:{{acl-probe}}check"),
            programs.chain(PROVIDER_SENDS.iter().copied()),
        )
    }

    /// The event-gate provider: its `programs`, `EVALSHA`, `EVAL`, `PING` and the event
    /// lookup's `HGET`.
    pub(crate) fn gates(prefix: &str, programs: &[&'static Script]) -> Self {
        let programs = programs.iter().map(|p| (p.name, p.commands));
        Self::new(
            format!("{prefix}:*"),
            format!("{prefix}:gate:{{acl-probe}}:check"),
            programs
                .chain(PROVIDER_SENDS.iter().copied())
                .chain(GATE_PROVIDER_SENDS.iter().copied()),
        )
    }

    /// Adds what the topology and options of `settings` need: `CLUSTER SLOTS` on a cluster,
    /// `WAIT` with `min_replicas_ack`.
    pub(crate) fn for_settings(mut self, settings: &RedisSettings) -> Self {
        if matches!(settings.topology, Topology::Cluster { .. }) {
            self.needs.push(Need {
                command: &CLUSTER_SLOTS,
                used_by: vec!["the cluster slot map"],
            });
        }
        if settings.min_replicas_ack > 0 {
            self.needs.push(Need {
                command: &WAIT,
                used_by: vec!["min_replicas_ack"],
            });
        }
        self
    }

    fn new(
        pattern: String,
        probe_key: String,
        users: impl IntoIterator<Item = (&'static str, &'static [&'static Command])>,
    ) -> Self {
        let mut needs: Vec<Need> = Vec::new();
        for (user, commands) in users {
            for &command in commands {
                match needs.iter_mut().find(|n| n.command.name == command.name) {
                    Some(n) => n.used_by.push(user),
                    None => needs.push(Need {
                        command,
                        used_by: vec![user],
                    }),
                }
            }
        }
        Self {
            pattern,
            probe_key,
            needs,
        }
    }

    /// The check program's `ARGV`: each probe as its argument count and its arguments.
    fn argv(&self) -> Vec<String> {
        let mut argv = Vec::new();
        for n in &self.needs {
            let args: Vec<&str> = n.command.probe_args(&self.probe_key).collect();
            argv.push(args.len().to_string());
            argv.extend(args.iter().map(|a| (*a).to_owned()));
        }
        argv
    }

    /// `Ok` when every verdict is `PERMITTED`; otherwise the message that names every
    /// missing command, who needs it and the rule that grants it.
    fn judge(&self, user: &str, verdicts: &[Verdict]) -> Result<(), String> {
        // `parse` already holds the reply to one verdict per probe; a shorter list must not
        // leave a need unjudged (zip would stop early).
        if verdicts.len() != self.needs.len() {
            return Err(format!(
                "ACL check: {} verdicts for {} probes",
                verdicts.len(),
                self.needs.len()
            ));
        }
        let mut denied = Vec::new();
        let mut unknown = Vec::new();
        let mut failed = Vec::new();
        for (need, verdict) in self.needs.iter().zip(verdicts) {
            match verdict {
                Verdict::Permitted => {}
                Verdict::Denied => denied.push(need),
                Verdict::Unknown => unknown.push(need),
                Verdict::Error => failed.push(need),
            }
        }
        if denied.is_empty() && unknown.is_empty() && failed.is_empty() {
            return Ok(());
        }
        let mut parts = Vec::new();
        if !denied.is_empty() {
            let what: Vec<String> = denied
                .iter()
                .map(|n| {
                    let on = if n.command.takes_key() {
                        format!(" on {:?} keys", self.pattern)
                    } else {
                        String::new()
                    };
                    format!("{}{on} (used by {})", n.command.name, n.used_by.join(", "))
                })
                .collect();
            let mut grant: Vec<String> = denied.iter().map(|n| n.command.grant()).collect();
            // A key command is refused for its command or for its key; the probe cannot tell
            // which, and granting both is what a least-privilege user has anyway.
            if denied.iter().any(|n| n.command.takes_key()) {
                grant.push(format!("~{}", self.pattern));
            }
            parts.push(format!(
                "ACL user {user:?} may not run {}; grant {}",
                what.join(", nor "),
                grant.join(" ")
            ));
        }
        for (list, why) in [
            (&unknown, "the server does not know"),
            (&failed, "the ACL check could not judge"),
        ] {
            if !list.is_empty() {
                let mut s = why.to_owned();
                for (i, n) in list.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    let _ = write!(
                        s,
                        "{sep}{} (used by {})",
                        n.command.name,
                        n.used_by.join(", ")
                    );
                }
                parts.push(s);
            }
        }
        Err(parts.join("; "))
    }
}

/// The commands the providers send themselves, and what for.
static PROVIDER_SENDS: [(&str, &[&Command]); 3] = [
    ("every program call", &[&EVALSHA]),
    ("the NOSCRIPT fallback", &[&EVAL]),
    ("readiness", &[&PING]),
];

/// What the gate provider sends itself beside [`PROVIDER_SENDS`].
static GATE_PROVIDER_SENDS: [(&str, &[&Command]); 1] = [("the event lookup", &[&HGET])];

/// The verdict of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Permitted,
    Denied,
    Unknown,
    Error,
}

/// What the check program answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CheckReply {
    Checked(Vec<Verdict>),
    /// No `redis.acl_check_cmd`: the server is older than 7.0.
    Unsupported,
}

/// Why a check reply was refused (and the connection made `Incompatible`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CheckReplyError {
    #[error("reply is not a two-field array: {0}")]
    Shape(String),
    #[error("unknown status {0:?}")]
    Status(String),
    #[error("{got} verdicts for {expected} probes")]
    Count { got: usize, expected: usize },
    #[error("verdict {index}: {got}")]
    Verdict { index: usize, got: String },
    #[error("{0} answered: this build sent a probe list the program refuses")]
    Invalid(&'static str),
}

fn text(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

/// Short description of an unexpected value, without echoing large payloads.
fn describe(v: &Value) -> String {
    let s = format!("{v:?}");
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// Parses the check program's reply strictly: a status this build knows, and for
/// `ACL_CHECKED` exactly one known verdict per probe. Anything else is an error, never a pass.
fn parse(value: &Value, probes: usize) -> Result<CheckReply, CheckReplyError> {
    let Value::Array(fields) = value else {
        return Err(CheckReplyError::Shape(describe(value)));
    };
    let [status, verdicts] = fields.as_slice() else {
        return Err(CheckReplyError::Shape(describe(value)));
    };
    let (Some(status), Value::Array(verdicts)) = (text(status), verdicts) else {
        return Err(CheckReplyError::Shape(describe(value)));
    };
    match status {
        b"ACL_CHECKED" => {}
        b"UNSUPPORTED" if verdicts.is_empty() => return Ok(CheckReply::Unsupported),
        b"INVALID" => return Err(CheckReplyError::Invalid("INVALID")),
        other => {
            return Err(CheckReplyError::Status(
                String::from_utf8_lossy(other).chars().take(40).collect(),
            ));
        }
    }
    if verdicts.len() != probes {
        return Err(CheckReplyError::Count {
            got: verdicts.len(),
            expected: probes,
        });
    }
    verdicts
        .iter()
        .enumerate()
        .map(|(index, v)| match text(v) {
            Some(b"PERMITTED") => Ok(Verdict::Permitted),
            Some(b"DENIED") => Ok(Verdict::Denied),
            Some(b"UNKNOWN") => Ok(Verdict::Unknown),
            Some(b"ERROR") => Ok(Verdict::Error),
            _ => Err(CheckReplyError::Verdict {
                index,
                got: describe(v),
            }),
        })
        .collect::<Result<_, _>>()
        .map(CheckReply::Checked)
}

/// Runs the check on a new connection logged in as `user` (the configured ACL user; `None`
/// is Redis's `default` user; the name is only used in messages). `Ok` when everything
/// `needs` lists is permitted.
///
/// # Errors
/// [`Attempt::Incompatible`] naming what is missing (or why the check cannot run, or the
/// reply it could not read); [`Attempt::Down`] when the check failed in transit or the server
/// refused it for now (`LOADING`, `BUSY`, ...).
pub(crate) async fn check(conn: &Conn, needs: &Needs, user: Option<&str>) -> Result<(), Attempt> {
    let user = user.unwrap_or("default");
    let argv = needs.argv();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(CHECK_PROGRAM.source).arg(0);
    for a in &argv {
        cmd.arg(a.as_str());
    }
    let refused = |code: &str, detail: String| match (code, failure::server_error(code)) {
        ("NOPERM", _) => Attempt::Incompatible(format!(
            "ACL user {user:?} may not run EVAL, so neither the programs nor the ACL check can \
             run ({detail}); grant +eval +evalsha"
        )),
        (_, Failure::Unavailable(_)) => Attempt::Down(format!("ACL check: {detail}")),
        _ => Attempt::Incompatible(format!("ACL check failed: {detail}")),
    };
    let value = match conn.send(&cmd).await {
        Ok(Value::ServerError(e)) => return Err(refused(e.code(), e.to_string())),
        Err(e) => return Err(Attempt::Down(format!("ACL check: {e}"))),
        Ok(value) => value,
    };
    match parse(&value, needs.needs.len()) {
        Ok(CheckReply::Checked(verdicts)) => {
            needs.judge(user, &verdicts).map_err(Attempt::Incompatible)
        }
        Ok(CheckReply::Unsupported) => Err(Attempt::Incompatible(
            "the server has no redis.acl_check_cmd (Redis older than 7.0), so the ACL user's \
             permissions cannot be checked"
                .to_owned(),
        )),
        Err(e) => Err(Attempt::Incompatible(format!(
            "ACL check ({}): unusable reply: {e}",
            CHECK_PROGRAM.name
        ))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;
    use std::sync::LazyLock;

    use super::*;
    use crate::programs;
    use crate::script::tests::called_commands;

    /// The rate-limit provider's needs under the default prefix.
    static RATE_RL: LazyLock<Needs> = LazyLock::new(|| Needs::rate("rl", &programs::scripts()));

    #[test]
    fn the_check_program_is_headed_and_runs_nothing_it_probes() {
        assert!(
            CHECK_PROGRAM
                .source
                .starts_with(&format!("-- {}", CHECK_PROGRAM.name))
        );
        assert_eq!(
            called_commands(CHECK_PROGRAM.source).map(|c| c.len()),
            Ok(0)
        );
        assert!(CHECK_PROGRAM.commands.is_empty());
        assert!(CHECK_PROGRAM.source.contains("redis.acl_check_cmd"));
    }

    /// The names of the commands `needs` holds, for the tests of the programs' lists.
    pub(crate) fn names(needs: &Needs) -> BTreeSet<&'static str> {
        needs.needs.iter().map(|n| n.command.name).collect()
    }

    /// The key `needs` probes.
    pub(crate) fn probe_key(needs: &Needs) -> &str {
        &needs.probe_key
    }

    #[test]
    fn needs_cover_the_programs_and_what_the_provider_sends() {
        let rate = names(&RATE_RL);
        let want: BTreeSet<&str> = ["TIME", "GET", "SET", "EVALSHA", "EVAL", "PING"].into();
        assert_eq!(rate, want);
        // Every probe key sits under the prefix, in the layout of the provider's keys.
        assert!(RATE_RL.probe_key.starts_with("rl:{"));
        // ARGV: count, then the arguments, for each probe in order.
        let argv = RATE_RL.argv();
        assert_eq!(argv[..2], ["1", "TIME"]);
        assert_eq!(argv[2..4], ["2".to_owned(), "GET".to_owned()]);
        assert_eq!(argv[4], RATE_RL.probe_key);
    }

    fn array(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn checked(verdicts: &[&str]) -> Value {
        array(vec![
            bulk("ACL_CHECKED"),
            array(verdicts.iter().map(|v| bulk(v)).collect()),
        ])
    }

    #[test]
    fn a_reply_with_one_known_verdict_per_probe_parses() {
        assert_eq!(
            parse(&checked(&["PERMITTED", "DENIED", "UNKNOWN", "ERROR"]), 4),
            Ok(CheckReply::Checked(vec![
                Verdict::Permitted,
                Verdict::Denied,
                Verdict::Unknown,
                Verdict::Error
            ]))
        );
        assert_eq!(
            parse(&array(vec![bulk("UNSUPPORTED"), array(vec![])]), 3),
            Ok(CheckReply::Unsupported)
        );
    }

    #[test]
    fn anything_unexpected_in_a_reply_is_an_error_never_a_pass() {
        let bad = [
            // Too few or too many verdicts: a probe would go unjudged.
            checked(&["PERMITTED"]),
            checked(&["PERMITTED", "PERMITTED", "PERMITTED"]),
            // Unknown or differently encoded verdicts.
            checked(&["PERMITTED", "permitted"]),
            checked(&["PERMITTED", "YES"]),
            array(vec![
                bulk("ACL_CHECKED"),
                array(vec![bulk("PERMITTED"), Value::Int(1)]),
            ]),
            array(vec![
                bulk("ACL_CHECKED"),
                array(vec![bulk("PERMITTED"), Value::Boolean(true)]),
            ]),
            array(vec![
                Value::SimpleString("ACL_CHECKED".into()),
                array(vec![bulk("PERMITTED"), bulk("PERMITTED")]),
            ]),
            // Other statuses and shapes.
            array(vec![bulk("INVALID"), array(vec![])]),
            array(vec![
                bulk("OK"),
                array(vec![bulk("PERMITTED"), bulk("PERMITTED")]),
            ]),
            array(vec![bulk("UNSUPPORTED"), array(vec![bulk("PERMITTED")])]),
            array(vec![bulk("ACL_CHECKED")]),
            array(vec![
                bulk("ACL_CHECKED"),
                array(vec![bulk("PERMITTED"), bulk("PERMITTED")]),
                bulk("extra"),
            ]),
            array(vec![bulk("ACL_CHECKED"), bulk("PERMITTED")]),
            Value::Nil,
            Value::Int(1),
            Value::Okay,
            bulk("ACL_CHECKED"),
        ];
        for v in bad {
            assert!(parse(&v, 2).is_err(), "{v:?}");
        }
    }

    #[test]
    fn the_refusal_names_every_missing_command_its_users_and_the_grant() {
        let needs = &*RATE_RL;
        let verdicts = |denied: &[&str]| -> Vec<Verdict> {
            needs
                .needs
                .iter()
                .map(|n| {
                    if denied.contains(&n.command.name) {
                        Verdict::Denied
                    } else {
                        Verdict::Permitted
                    }
                })
                .collect()
        };
        assert_eq!(needs.judge("limiter", &verdicts(&[])), Ok(()));

        let why = needs
            .judge("limiter", &verdicts(&["SET"]))
            .expect_err("SET denied");
        assert!(
            why.starts_with(
                "ACL user \"limiter\" may not run SET on \"rl:*\" keys (used by rate-fixed-window-v2.lua, "
            ),
            "{why}"
        );
        assert!(why.ends_with("; grant +set ~rl:*"), "{why}");
        for p in programs::scripts() {
            assert!(why.contains(p.name), "{why}");
        }

        let why = needs
            .judge("limiter", &verdicts(&["TIME", "EVALSHA"]))
            .expect_err("denied");
        assert!(why.contains("TIME (used by rate-"), "{why}");
        assert!(!why.contains("TIME on"), "TIME takes no key: {why}");
        assert!(
            why.contains("EVALSHA on \"rl:*\" keys (used by every program call)"),
            "{why}"
        );
        assert!(why.ends_with("; grant +time +evalsha ~rl:*"), "{why}");

        let why = needs
            .judge("limiter", &verdicts(&["TIME"]))
            .expect_err("denied");
        assert!(
            why.ends_with("; grant +time"),
            "no key rule for TIME: {why}"
        );

        let mut v = verdicts(&[]);
        v[0] = Verdict::Unknown;
        v[1] = Verdict::Error;
        let why = needs.judge("limiter", &v).expect_err("not judged");
        assert!(why.contains("the server does not know TIME"), "{why}");
        assert!(why.contains("the ACL check could not judge GET"), "{why}");
    }
}
