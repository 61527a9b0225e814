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
//! What to check is derived, not listed: each program manifest declares the commands its
//! source calls (a unit test below parses every source and holds the manifests to it), and
//! [`Needs`] adds the ones the provider sends itself (`EVALSHA`, `EVAL`, `PING`, the gate
//! provider's `HGET`). Optional commands (`INFO`, `CONFIG GET`, `SCRIPT LOAD`) are not checked:
//! the provider skips what they serve when they are refused.
//!
//! A check that fails in transit leaves the connection down (retried like any failed
//! connect); a reply this build does not understand is `Incompatible`: never "permitted".

use std::fmt::Write as _;

use redis::Value;

use crate::connection::Attempt;
use crate::failure::{self, Failure};
use crate::gate::programs::GATE_PROGRAMS;
use crate::programs::PROGRAMS;

/// One Redis command a program or the provider sends, as ACL rules name it, and how to ask
/// whether it is permitted.
#[derive(Debug)]
pub struct Command {
    /// The ACL name: `SET`, `XINFO|STREAM` (container and subcommand).
    pub name: &'static str,
    /// The probe: the command with dummy arguments of the real call's shape, `$key` where the
    /// real call has a key, so that Redis checks the key where the command's key specs say.
    probe: &'static str,
}

/// Placeholder of the probe key in [`Command::probe`].
const KEY: &str = "$key";

impl Command {
    /// Whether the command takes a key (so the user's key pattern matters too).
    pub fn takes_key(&self) -> bool {
        self.probe.split_whitespace().any(|w| w == KEY)
    }

    /// The ACL rule that grants it: `+set`, `+xinfo|stream`.
    pub fn grant(&self) -> String {
        format!("+{}", self.name.to_ascii_lowercase())
    }

    /// The probe's arguments, `key` where the real call has its key.
    pub fn probe_args<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.probe
            .split_whitespace()
            .map(move |w| if w == KEY { key } else { w })
    }
}

macro_rules! commands {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $probe:literal;)*) => {
        $($(#[$doc])* pub static $id: Command = Command { name: $name, probe: $probe };)*
        /// Every command this build knows how to probe.
        pub static ALL: &[&Command] = &[$(&$id),*];
    };
}

commands! {
    /// The server clock: the time source of every program that decides.
    TIME = "TIME", "TIME";
    GET = "GET", "GET $key";
    /// As the rate-limit programs write: with a TTL.
    SET = "SET", "SET $key v PX 1";
    INCR = "INCR", "INCR $key";
    HGET = "HGET", "HGET $key f";
    HMGET = "HMGET", "HMGET $key f";
    HSET = "HSET", "HSET $key f v";
    HDEL = "HDEL", "HDEL $key f";
    HLEN = "HLEN", "HLEN $key";
    ZADD = "ZADD", "ZADD $key 1 m";
    ZREM = "ZREM", "ZREM $key m";
    ZRANGE = "ZRANGE", "ZRANGE $key 0 0 WITHSCORES";
    ZRANGEBYSCORE = "ZRANGEBYSCORE", "ZRANGEBYSCORE $key -inf 1 LIMIT 0 1";
    /// As the gate programs append: trimmed, explicit id.
    XADD = "XADD", "XADD $key MAXLEN ~ 1 1-0 f v";
    XRANGE = "XRANGE", "XRANGE $key 1-0 + COUNT 1";
    XREVRANGE = "XREVRANGE", "XREVRANGE $key + - COUNT 1";
    XINFO_STREAM = "XINFO|STREAM", "XINFO STREAM $key";
    EXISTS = "EXISTS", "EXISTS $key";
    /// Every program call; the key is declared, so the key pattern applies.
    EVALSHA = "EVALSHA", "EVALSHA 0000000000000000000000000000000000000000 1 $key";
    /// The `NOSCRIPT` fallback (and this check).
    EVAL = "EVAL", "EVAL return 1 $key";
    /// `readiness()`.
    PING = "PING", "PING";
    /// The cluster slot map.
    CLUSTER_SLOTS = "CLUSTER|SLOTS", "CLUSTER SLOTS";
    /// `min_replicas_ack`.
    WAIT = "WAIT", "WAIT 1 1";
}

/// The check program (read only, no keys): see its header in `lua/`.
pub static CHECK_PROGRAM: CheckProgram = CheckProgram {
    name: "acl-check-v1.lua",
    source: include_str!("../../../lua/acl-check-v1.lua"),
};

/// The embedded check program.
#[derive(Debug)]
pub struct CheckProgram {
    /// File name in `lua/`.
    pub name: &'static str,
    /// The exact source sent with `EVAL`.
    pub source: &'static str,
}

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
    /// The rate-limit provider: its programs (every algorithm: policies can change on a
    /// restart, the user should not have to), `EVALSHA`, `EVAL` and `PING`.
    pub(crate) fn rate(prefix: &str) -> Self {
        let programs = PROGRAMS.iter().map(|p| (p.name, p.commands));
        Self::new(
            format!("{prefix}:*"),
            format!("{prefix}:{{acl-probe}}check"),
            programs.chain(PROVIDER_SENDS.iter().copied()),
        )
    }

    /// The event-gate provider: its programs, `EVALSHA`, `EVAL`, `PING` and the event
    /// lookup's `HGET`.
    pub(crate) fn gates(prefix: &str) -> Self {
        let programs = GATE_PROGRAMS.iter().map(|p| (p.name, p.commands));
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
    pub(crate) fn for_settings(mut self, settings: &crate::RedisSettings) -> Self {
        if matches!(settings.topology, crate::Topology::Cluster { .. }) {
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
enum Reply {
    Checked(Vec<Verdict>),
    /// No `redis.acl_check_cmd`: the server is older than 7.0.
    Unsupported,
}

/// Why a check reply was refused (and the connection made `Incompatible`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ReplyError {
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
fn parse(value: &Value, probes: usize) -> Result<Reply, ReplyError> {
    let Value::Array(fields) = value else {
        return Err(ReplyError::Shape(describe(value)));
    };
    let [status, verdicts] = fields.as_slice() else {
        return Err(ReplyError::Shape(describe(value)));
    };
    let (Some(status), Value::Array(verdicts)) = (text(status), verdicts) else {
        return Err(ReplyError::Shape(describe(value)));
    };
    match status {
        b"ACL_CHECKED" => {}
        b"UNSUPPORTED" if verdicts.is_empty() => return Ok(Reply::Unsupported),
        b"INVALID" => return Err(ReplyError::Invalid("INVALID")),
        other => {
            return Err(ReplyError::Status(
                String::from_utf8_lossy(other).chars().take(40).collect(),
            ));
        }
    }
    if verdicts.len() != probes {
        return Err(ReplyError::Count {
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
            _ => Err(ReplyError::Verdict {
                index,
                got: describe(v),
            }),
        })
        .collect::<Result<_, _>>()
        .map(Reply::Checked)
}

/// Runs the check on a new connection logged in as `user` (the configured ACL user; `None`
/// is Redis's `default` user; the name is only used in messages). `Ok` when everything
/// `needs` lists is permitted.
///
/// # Errors
/// [`Attempt::Incompatible`] naming what is missing (or why the check cannot run, or the
/// reply it could not read); [`Attempt::Down`] when the check failed in transit or the server
/// refused it for now (`LOADING`, `BUSY`, ...).
pub(crate) async fn check(
    conn: &crate::wire::Conn,
    needs: &Needs,
    user: Option<&str>,
) -> Result<(), Attempt> {
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
    let value = match conn.send_packed_command(&cmd).await {
        Ok(Value::ServerError(e)) => return Err(refused(e.code(), e.to_string())),
        Err(e) => match e.code() {
            Some(code) => return Err(refused(code, e.to_string())),
            None => return Err(Attempt::Down(format!("ACL check: {e}"))),
        },
        Ok(value) => value,
    };
    match parse(&value, needs.needs.len()) {
        Ok(Reply::Checked(verdicts)) => needs.judge(user, &verdicts).map_err(Attempt::Incompatible),
        Ok(Reply::Unsupported) => Err(Attempt::Incompatible(
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
mod tests {
    use std::collections::BTreeSet;
    use std::sync::LazyLock;

    use super::*;

    /// Longest probe the check program accepts (the bound of its `ARGV` count field).
    const MAX_PROBE_ARGS: usize = 32;

    /// The rate-limit provider's needs under the default prefix.
    static RATE_RL: LazyLock<Needs> = LazyLock::new(|| Needs::rate("rl"));

    /// Containers whose first argument is a subcommand that ACL rules name (`XINFO|STREAM`).
    const CONTAINERS: &[&str] = &[
        "XINFO", "XGROUP", "SCRIPT", "CONFIG", "CLIENT", "OBJECT", "MEMORY", "FUNCTION", "ACL",
        "COMMAND", "CLUSTER", "PUBSUB", "SLOWLOG", "LATENCY", "MODULE",
    ];

    /// Every `redis.call('X'` / `redis.pcall('X'` of a Lua source outside comments, as ACL
    /// names it; `Err` for a call whose command is not a string literal (which no manifest
    /// could declare).
    fn called_commands(source: &str) -> Result<BTreeSet<String>, String> {
        let mut found = BTreeSet::new();
        for (no, line) in source.lines().enumerate() {
            // No program has "--" inside a string literal; the manifest test would show it.
            let code = line.split("--").next().unwrap_or_default();
            let mut rest = code;
            while let Some(at) = rest.find("redis.") {
                rest = &rest[at + "redis.".len()..];
                let Some(args) = rest
                    .strip_prefix("call(")
                    .or_else(|| rest.strip_prefix("pcall("))
                else {
                    continue;
                };
                let literal = |s: &str| -> Option<(String, usize)> {
                    let s_trim = s.trim_start();
                    let skipped = s.len() - s_trim.len();
                    let q = s_trim.chars().next().filter(|c| *c == '\'' || *c == '"')?;
                    let end = s_trim[1..].find(q)?;
                    Some((s_trim[1..=end].to_owned(), skipped + end + 2))
                };
                let Some((name, used)) = literal(args) else {
                    return Err(format!("line {}: a call without a literal command", no + 1));
                };
                let mut name = name.to_ascii_uppercase();
                if CONTAINERS.contains(&name.as_str()) {
                    let sub = args[used..]
                        .trim_start()
                        .strip_prefix(',')
                        .and_then(literal)
                        .ok_or_else(|| format!("line {}: {name} without a subcommand", no + 1))?;
                    name = format!("{name}|{}", sub.0.to_ascii_uppercase());
                }
                found.insert(name);
            }
        }
        Ok(found)
    }

    fn declared(commands: &[&Command]) -> BTreeSet<String> {
        commands.iter().map(|c| c.name.to_owned()).collect()
    }

    #[test]
    fn every_manifest_declares_exactly_the_commands_its_source_calls() {
        let all = PROGRAMS
            .iter()
            .map(|p| (p.name, p.source, p.commands))
            .chain(GATE_PROGRAMS.iter().map(|p| (p.name, p.source, p.commands)));
        for (name, source, commands) in all {
            let called = called_commands(source).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(called, declared(commands), "{name}");
            assert_eq!(
                commands.len(),
                called.len(),
                "{name}: a command is declared twice"
            );
        }
    }

    #[test]
    fn the_source_parser_sees_what_the_manifest_test_relies_on() {
        let src = "local a = redis.call('GET', KEYS[1]) -- redis.call('DEL', KEYS[1])\n\
                   local b = redis.pcall( \"xinfo\", 'STREAM', KEYS[2])\n\
                   -- redis.call('FLUSHALL')\n\
                   redis.call('HSET', KEYS[1], 'f', redis.call('TIME')[1])";
        let got = called_commands(src).expect("all literal");
        let want: BTreeSet<String> = ["GET", "XINFO|STREAM", "HSET", "TIME"]
            .map(str::to_owned)
            .into();
        assert_eq!(got, want);
        assert!(called_commands("redis.call(cmd, KEYS[1])").is_err());
        assert!(called_commands("redis.pcall('XINFO', KEYS[1])").is_err());
    }

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
        assert!(CHECK_PROGRAM.source.contains("redis.acl_check_cmd"));
    }

    #[test]
    fn every_probe_names_its_command_and_fits_the_program() {
        for c in ALL {
            let words: Vec<&str> = c.probe_args("k").collect();
            let name: Vec<&str> = c.name.split('|').collect();
            assert_eq!(&words[..name.len()], name.as_slice(), "{}", c.name);
            assert!(words.len() <= MAX_PROBE_ARGS, "{}", c.name);
            assert!(
                c.probe.matches(KEY).count() <= 1,
                "{}: one probe key at most",
                c.name
            );
            assert_eq!(c.name, c.name.to_ascii_uppercase());
        }
        assert!(SET.takes_key() && EVALSHA.takes_key() && XINFO_STREAM.takes_key());
        assert!(!TIME.takes_key() && !PING.takes_key());
        assert_eq!(XINFO_STREAM.grant(), "+xinfo|stream");
    }

    #[test]
    fn needs_cover_the_programs_and_what_the_provider_sends() {
        let names =
            |n: &Needs| -> BTreeSet<&str> { n.needs.iter().map(|n| n.command.name).collect() };
        let rate = names(&RATE_RL);
        let want: BTreeSet<&str> = ["TIME", "GET", "SET", "EVALSHA", "EVAL", "PING"].into();
        assert_eq!(rate, want);
        let gates = Needs::gates("rl");
        let gate_names = names(&gates);
        for c in [
            "HGET",
            "XADD",
            "XINFO|STREAM",
            "EVALSHA",
            "EVAL",
            "PING",
            "TIME",
        ] {
            assert!(gate_names.contains(c), "{c}");
        }
        assert!(
            !gate_names.contains("SET"),
            "no gate program writes with SET"
        );
        // Every probe key sits under the prefix, in the layout of the provider's keys.
        assert!(RATE_RL.probe_key.starts_with("rl:{"));
        assert!(gates.probe_key.starts_with("rl:gate:{"));
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
            Ok(Reply::Checked(vec![
                Verdict::Permitted,
                Verdict::Denied,
                Verdict::Unknown,
                Verdict::Error
            ]))
        );
        assert_eq!(
            parse(&array(vec![bulk("UNSUPPORTED"), array(vec![])]), 3),
            Ok(Reply::Unsupported)
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
                "ACL user \"limiter\" may not run SET on \"rl:*\" keys (used by rate-fixed-window-v1.lua, "
            ),
            "{why}"
        );
        assert!(why.ends_with("; grant +set ~rl:*"), "{why}");
        for p in &PROGRAMS {
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
