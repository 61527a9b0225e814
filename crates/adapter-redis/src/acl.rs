//! The Redis commands the programs and the provider send, as ACL rules name them.
//!
//! Redis checks ACL rules for every `redis.call` inside a script, and a denied call is an `ERR`
//! raised *in the middle* of the script: writes made before it stay (there is no rollback).
//! So what an ACL user needs is exactly the commands the programs call. Each program manifest
//! declares them as [`Command`]s (a unit test below parses every source and holds the
//! manifests to it), each with a probe of the real call's shape, so that the user's
//! permissions can be asked for without running anything.

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
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::gate::programs::GATE_PROGRAMS;
    use crate::programs::PROGRAMS;

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
    fn every_probe_names_its_command_and_fits_the_program() {
        for c in ALL {
            let words: Vec<&str> = c.probe_args("k").collect();
            let name: Vec<&str> = c.name.split('|').collect();
            assert_eq!(&words[..name.len()], name.as_slice(), "{}", c.name);
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
}
