//! One type for every embedded Lua program: [`Script`] (file name, exact source, SHA1, the
//! commands it calls), and how one call of it is written (`EVALSHA` of the SHA1, or `EVAL` of
//! the source after `NOSCRIPT`).
//!
//! ## Where the sources come from
//!
//! The programs live in `crates/adapter-redis/lua/` (`lua/` at the workspace root links to it, so
//! the crate packages them), one reviewed, versioned file each: the
//! acceptance tests load the very same files into a real server, and the docs point at them.
//! `embedded!` is the one place in this crate that knows that path; every program is
//! embedded through it with `include_str!` (so a changed file rebuilds the crate), never by a
//! relative path that depends on the depth of the including module.

use std::sync::OnceLock;

use redis::Value;

use crate::commands::{self, Command};
use crate::resp;

/// The oldest Redis every program of this build runs on (`redis.acl_check_cmd`, the
/// `redis.call` error semantics the programs rely on).
pub const MIN_REDIS_VERSION: (u32, u32) = (7, 0);

/// A [`Script`] of `lua/<file>` that calls `commands`, its source embedded at compile time.
macro_rules! embedded {
    ($file:literal, $commands:expr) => {
        $crate::script::Script::new(
            $file,
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
            $commands,
        )
    };
}
pub(crate) use embedded;

/// One embedded Lua program and what is known about it.
#[derive(Debug)]
pub struct Script {
    /// File name in `lua/`, e.g. `rate-token-bucket-v2.lua`.
    pub name: &'static str,
    /// The exact source sent with `EVAL` and hashed for `EVALSHA`.
    pub source: &'static str,
    /// Every Redis command the source calls, as ACL rules name it: what the start-up ACL
    /// check asks for (a test of each manifest holds this to the source).
    pub commands: &'static [&'static Command],
    /// Oldest Redis the program runs on (`major`, `minor`).
    pub min_redis_version: (u32, u32),
    sha1: OnceLock<String>,
}

impl Script {
    /// Use [`embedded!`], which reads the source from `lua/`.
    pub(crate) const fn new(
        name: &'static str,
        source: &'static str,
        commands: &'static [&'static Command],
    ) -> Self {
        Self {
            name,
            source,
            commands,
            min_redis_version: MIN_REDIS_VERSION,
            sha1: OnceLock::new(),
        }
    }

    /// Lowercase hex SHA1 of [`Self::source`], as `SCRIPT LOAD` answers it (computed once).
    pub fn sha1(&self) -> &str {
        self.sha1
            .get_or_init(|| sha1_smol::Sha1::from(self.source).digest().to_string())
    }

    /// Whether the program reads the server clock (`TIME`, in one marked block).
    pub fn reads_time(&self) -> bool {
        self.commands.iter().any(|c| c.name == commands::TIME.name)
    }

    /// The variant used by the differential tests only: the marked `TIME` block replaced by
    /// `local now = tonumber(ARGV[#ARGV])`, so `now` comes from one extra trailing argument.
    /// Nothing else differs, so those tests exercise the production body.
    ///
    /// # Errors
    /// A description of the problem when the source lacks exactly one well-formed
    /// `-- @time-source begin` / `-- @time-source end` block.
    pub fn test_variant(&self) -> Result<String, String> {
        const BEGIN: &str = "-- @time-source begin";
        const END: &str = "-- @time-source end";
        let source = self.source;
        let (Some(b), Some(e)) = (source.find(BEGIN), source.find(END)) else {
            return Err(format!("{}: no @time-source block", self.name));
        };
        if source.matches(BEGIN).count() != 1 || source.matches(END).count() != 1 || e < b {
            return Err(format!("{}: malformed @time-source block", self.name));
        }
        let end = e + END.len();
        Ok(format!(
            "{}local now = tonumber(ARGV[#ARGV]){}",
            &source[..b],
            &source[end..]
        ))
    }

    /// Appends one call as RESP: `EVAL <source>` when `eval`, else `EVALSHA <sha1>`, then
    /// what `args` writes.
    pub(crate) fn write_call(&self, out: &mut Vec<u8>, eval: bool, args: &dyn ScriptArgs) {
        let (verb, body) = if eval {
            ("EVAL", self.source)
        } else {
            ("EVALSHA", self.sha1())
        };
        resp::write_array(out, 2 + args.count());
        resp::write_bulk(out, verb.as_bytes());
        resp::write_bulk(out, body.as_bytes());
        args.write(out);
    }
}

/// What follows `EVALSHA <sha1>` (or `EVAL <source>`) in one call of a program: the key
/// count, the keys and the arguments, written straight into the connection's buffer (no
/// command object and no copy per call).
pub(crate) trait ScriptArgs: Sync {
    /// How many RESP bulk strings [`Self::write`] appends.
    fn count(&self) -> usize;
    /// Appends them.
    fn write(&self, out: &mut Vec<u8>);
    /// Whether `reply` (a reply, not an error) wrote state that `min_replicas_ack` must see
    /// acknowledged (a denial or a read wrote nothing worth waiting for).
    fn needs_ack(&self, reply: &Value) -> bool;
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Containers whose first argument is a subcommand that ACL rules name (`XINFO|STREAM`).
    const CONTAINERS: &[&str] = &[
        "XINFO", "XGROUP", "SCRIPT", "CONFIG", "CLIENT", "OBJECT", "MEMORY", "FUNCTION", "ACL",
        "COMMAND", "CLUSTER", "PUBSUB", "SLOWLOG", "LATENCY", "MODULE",
    ];

    /// Every `redis.call('X'` / `redis.pcall('X'` of a Lua source outside comments, as ACL
    /// names it; `Err` for a call whose command is not a string literal (which no manifest
    /// could declare).
    pub(crate) fn called_commands(source: &str) -> Result<BTreeSet<String>, String> {
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

    /// Holds `script`'s manifest to its source: it declares exactly the commands the source
    /// calls, each once.
    pub(crate) fn assert_declares_its_calls(script: &Script) {
        let called =
            called_commands(script.source).unwrap_or_else(|e| panic!("{}: {e}", script.name));
        let declared: BTreeSet<String> =
            script.commands.iter().map(|c| c.name.to_owned()).collect();
        assert_eq!(called, declared, "{}", script.name);
        assert_eq!(
            script.commands.len(),
            called.len(),
            "{}: a command is declared twice",
            script.name
        );
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

    /// `GET`-like arguments for the encoding test: one key, one argument.
    struct OneKey;

    impl ScriptArgs for OneKey {
        fn count(&self) -> usize {
            3
        }
        fn write(&self, out: &mut Vec<u8>) {
            resp::write_bulk(out, b"1");
            resp::write_bulk(out, b"k");
            resp::write_bulk_u64(out, 5);
        }
        fn needs_ack(&self, _: &Value) -> bool {
            false
        }
    }

    #[test]
    fn a_call_is_evalsha_of_the_sha1_or_eval_of_the_source() {
        static S: Script = Script::new("t-v1.lua", "return 1", &[]);
        let mut out = Vec::new();
        S.write_call(&mut out, false, &OneKey);
        let mut want = Vec::new();
        redis::cmd("EVALSHA")
            .arg(S.sha1())
            .arg(1)
            .arg("k")
            .arg(5)
            .write_packed_command(&mut want);
        assert_eq!(out, want);
        assert_eq!(S.sha1(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        out.clear();
        S.write_call(&mut out, true, &OneKey);
        want.clear();
        redis::cmd("EVAL")
            .arg("return 1")
            .arg(1)
            .arg("k")
            .arg(5)
            .write_packed_command(&mut want);
        assert_eq!(out, want);
    }
}
