//! The rate-limit Lua programs: one manifest per program (its [`Script`], version, algorithm,
//! key type), the exact source embedded at compile time, and the arguments each policy sends.
//!
//! Programs run with `EVALSHA` of the SHA1 computed once from the embedded source; on
//! `NOSCRIPT` the provider sends `EVAL` of that same source (which also caches it again) and
//! goes back to `EVALSHA`. The calling convention (KEYS, ARGV order, the seven-field reply)
//! is `docs/lua-programs.md`; [`arguments`] is its Rust side.

use shared_contract::{Algorithm, AlgorithmKind, RateLimitPolicy};

use crate::commands;
use crate::script::{Script, embedded};

/// The Redis type of a program's state key (what `TYPE key` answers once state exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// A string (`GET`/`SET`).
    String,
    /// A hash.
    Hash,
}

impl KeyType {
    /// The name `TYPE` answers: `"string"` or `"hash"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::String => "string",
            KeyType::Hash => "hash",
        }
    }
}

/// One rate-limit program: the embedded [`Script`] and what the provider knows about its
/// state.
#[derive(Debug)]
pub struct Program {
    /// The program itself: `lua/<name>`, its SHA1 and the commands it calls.
    pub script: Script,
    /// The version in the name; state written by another version is incompatible.
    pub version: u32,
    /// The algorithm the program decides.
    pub algorithm: AlgorithmKind,
    /// The type of its state key.
    pub key_type: KeyType,
}

macro_rules! program {
    ($file:literal, $kind:expr, $key_type:expr) => {
        Program {
            // Every rate-limit program reads the clock, reads its key and writes it back.
            script: embedded!($file, &[&commands::TIME, &commands::GET, &commands::SET]),
            version: 1,
            algorithm: $kind,
            key_type: $key_type,
        }
    };
}

/// Every rate-limit program of this build, one per rate algorithm.
pub static PROGRAMS: [Program; 5] = [
    program!(
        "rate-fixed-window-v1.lua",
        AlgorithmKind::FixedWindow,
        KeyType::String
    ),
    program!(
        "rate-sliding-counter-v1.lua",
        AlgorithmKind::SlidingWindow,
        KeyType::String
    ),
    program!(
        "rate-token-bucket-v1.lua",
        AlgorithmKind::TokenBucket,
        KeyType::String
    ),
    program!("rate-gcra-v1.lua", AlgorithmKind::Gcra, KeyType::String),
    program!(
        "rate-sliding-log-v1.lua",
        AlgorithmKind::SlidingLog,
        KeyType::String
    ),
];

/// The multi-limit program: 1..=8 members of any algorithms decided as one, with an
/// optional evaluation id (calling convention: `docs/lua-programs.md`). Its member functions
/// are the single programs' bodies (a test regenerates them from [`PROGRAMS`]), so it reads
/// and writes exactly their state encodings.
pub static MULTI: Script = embedded!(
    "rate-multi-v1.lua",
    &[&commands::TIME, &commands::GET, &commands::SET]
);

/// Every program's script, as a provider preloads them and the ACL check covers them.
pub(crate) fn scripts() -> Vec<&'static Script> {
    PROGRAMS
        .iter()
        .map(|p| &p.script)
        .chain(std::iter::once(&MULTI))
        .collect()
}

/// The code of an algorithm in the multi program's arguments (also the low bits of its state
/// tag); 0 for none.
pub fn algorithm_code(kind: AlgorithmKind) -> u64 {
    match kind {
        AlgorithmKind::FixedWindow => 1,
        AlgorithmKind::SlidingWindow => 2,
        AlgorithmKind::TokenBucket => 3,
        AlgorithmKind::Gcra => 4,
        AlgorithmKind::SlidingLog => 5,
        // An algorithm this build has no program for: the multi program refuses code 0
        // (`INVALID`, reported `Incompatible(program)`), so it is never guessed at.
        _ => 0,
    }
}

/// The program of an algorithm.
pub fn program(kind: AlgorithmKind) -> &'static Program {
    // `PROGRAMS` has one entry per `AlgorithmKind::RATE`; the test below keeps it so. A
    // concurrency policy is never evaluated (refused before a program is chosen).
    PROGRAMS
        .iter()
        .find(|p| p.algorithm == kind)
        .unwrap_or(&PROGRAMS[0])
}

/// `ARGV[2..]` of `policy`, in the documented order: revision, max clock regression, cleanup
/// grace, then the algorithm's derived parameters. `ARGV[1]` (the cost) varies per request.
pub fn arguments(policy: &RateLimitPolicy) -> Vec<u64> {
    let mut args = vec![
        u64::from(policy.revision().get()),
        policy.max_clock_regression_ms(),
        policy.cleanup_grace_ms(),
    ];
    match policy.algorithm() {
        Algorithm::FixedWindow(p) => args.extend([p.limit(), p.window_ms()]),
        Algorithm::SlidingWindow(p) => args.extend([p.limit(), p.window_ms()]),
        Algorithm::TokenBucket(p) => args.extend([p.capacity(), p.scale(), p.units_per_ms()]),
        Algorithm::Gcra(p) => args.extend([p.burst(), p.interval_units(), p.units_per_ms()]),
        Algorithm::SlidingLog(p) => args.extend([p.limit(), p.window_ms()]),
        // Lease programs take their own arguments (`leases`); a concurrency policy is never
        // evaluated (the contract refuses it first), so no rate program sees these.
        Algorithm::Concurrency(p) => args.extend([p.limit(), p.lease_ttl_ms()]),
    }
    args
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{AlgorithmSpec, RateLimitPolicy};

    use super::*;

    #[test]
    fn every_algorithm_has_exactly_one_program() {
        for kind in AlgorithmKind::RATE {
            let n = PROGRAMS.iter().filter(|p| p.algorithm == kind).count();
            assert_eq!(n, 1, "{kind}");
            assert_eq!(program(kind).algorithm, kind);
        }
    }

    #[test]
    fn manifests_match_the_files() {
        for p in &PROGRAMS {
            let s = &p.script;
            assert!(s.name.starts_with("rate-") && s.name.ends_with("-v1.lua"));
            assert_eq!(p.version, 1);
            assert_eq!(s.sha1().len(), 40);
            assert!(s.sha1().bytes().all(|b| b.is_ascii_hexdigit()));
            // One TIME call, inside the marked block.
            assert_eq!(
                s.source.matches("redis.call('TIME')").count(),
                1,
                "{}",
                s.name
            );
            assert!(s.reads_time(), "{}", s.name);
            assert!(s.test_variant().is_ok(), "{}", s.name);
            // The header block documents the state's Redis type; the manifest must agree.
            let declared = format!("-- State: one {}", p.key_type.as_str());
            assert!(s.source.contains(&declared), "{}: {declared:?}", s.name);
            assert!(
                s.source.starts_with(&format!("-- {}", s.name)),
                "{}",
                s.name
            );
        }
    }

    #[test]
    fn every_manifest_declares_exactly_the_commands_its_source_calls() {
        for p in &PROGRAMS {
            crate::script::tests::assert_declares_its_calls(&p.script);
        }
    }

    /// The member functions of the multi program, generated from the single programs: each
    /// body after its time block, indented, as `local function member_<code>(ARGV, now, RAW)`,
    /// where `RAW` is the key's value as `redis.pcall('GET', key)` answers it (the driver
    /// reads it), the key count check dropped (the driver checks its keys), and the one
    /// `SET` and the allow after it becoming an allow that hands back the value and TTL to
    /// write. Then `M`, the functions by the algorithm code as ARGV spells it.
    fn multi_members() -> Result<String, String> {
        const SET: &str = "redis.call('SET', KEYS[1], value, 'PX', ";
        const GET: &str = "local raw = redis.pcall('GET', KEYS[1])";
        const KEYS: &str = "#KEYS ~= 1 or ";
        const INLINE: &str = "-- Everything is inline: the chunk runs once per call, so every \
                              helper function would be a\n-- new closure per call, and argument \
                              checks dominate the cost of a call.\n";
        let mut kinds = AlgorithmKind::RATE;
        kinds.sort_by_key(|k| algorithm_code(*k));
        let mut out = String::new();
        for kind in kinds {
            let s = &program(kind).script;
            let (_, body) = s
                .source
                .split_once("-- @time-source end\n")
                .ok_or_else(|| format!("{}: no time block", s.name))?;
            let body = body.trim_start_matches('\n').replacen(INLINE, "", 1);
            for (what, n) in [(SET, 1), (GET, 1), (KEYS, 1)] {
                if body.matches(what).count() != n {
                    return Err(format!("{}: {what:?} not exactly once", s.name));
                }
            }
            let body = body
                .replacen(GET, "local raw = RAW", 1)
                .replacen(KEYS, "", 1);
            let code = algorithm_code(kind);
            out.push_str(&format!(
                "-- @member {kind} begin: generated from {}\nlocal function member_{code}(ARGV, \
                 now, RAW)\n",
                s.name
            ));
            let mut lines = body.lines();
            while let Some(line) = lines.next() {
                let line = match line.split_once(SET) {
                    Some((indent, rest)) => {
                        let ttl = rest
                            .strip_suffix(')')
                            .ok_or_else(|| format!("{}: state write not on one line", s.name))?;
                        let allow = lines
                            .next()
                            .map(str::trim_start)
                            .filter(|l| l.starts_with("return { 'ALLOWED'"))
                            .ok_or_else(|| format!("{}: no allow after the write", s.name))?;
                        format!("{indent}{allow}, value, {ttl}")
                    }
                    None => line.to_owned(),
                };
                if line.is_empty() {
                    out.push('\n');
                } else {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            out.push_str(&format!("end\n-- @member {kind} end\n"));
        }
        let table: Vec<String> = kinds
            .iter()
            .map(|k| format!("['{0}'] = member_{0}", algorithm_code(*k)))
            .collect();
        out.push_str(&format!("local M = {{ {} }}\n", table.join(", ")));
        Ok(out)
    }

    /// Holds the generated section of `lua/rate-multi-v1.lua` to the single programs. With
    /// `RL_WRITE_MULTI_LUA=1` it rewrites the section instead (after a single program
    /// changed).
    #[test]
    fn multi_program_members_are_the_single_programs() {
        const BEGIN: &str = "-- @generated begin\n";
        const END: &str = "-- @generated end\n";
        let members = multi_members().expect("single programs of the expected shape");
        let source = MULTI.source;
        let (head, rest) = source.split_once(BEGIN).expect("generated begin marker");
        let (_, tail) = rest.split_once(END).expect("generated end marker");
        let want = format!("{head}{BEGIN}{members}{END}{tail}");
        if std::env::var_os("RL_WRITE_MULTI_LUA").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/rate-multi-v1.lua");
            std::fs::write(path, &want).expect("writable lua/");
            return;
        }
        assert!(
            source == want,
            "lua/rate-multi-v1.lua is not generated from the single programs; rerun this \
             test with RL_WRITE_MULTI_LUA=1"
        );
    }

    #[test]
    fn multi_program_is_preloaded_and_declares_its_calls() {
        assert!(scripts().iter().any(|s| s.name == MULTI.name));
        crate::script::tests::assert_declares_its_calls(&MULTI);
        assert_eq!(MULTI.source.matches("redis.call('TIME')").count(), 1);
        assert!(MULTI.test_variant().is_ok());
        assert!(MULTI.source.starts_with("-- rate-multi-v1.lua"));
    }

    #[test]
    fn test_variant_differs_only_in_the_time_block() {
        let p = &program(AlgorithmKind::TokenBucket).script;
        let t = p.test_variant().expect("a time block");
        assert!(!t.contains("redis.call('TIME')"));
        assert!(t.contains("local now = tonumber(ARGV[#ARGV])"));
        let (head, _) = p
            .source
            .split_once("-- @time-source begin")
            .expect("marker");
        assert!(t.starts_with(head));
    }

    fn policy(algorithm: AlgorithmSpec, max_cost: u64) -> RateLimitPolicy {
        RateLimitPolicy::with_algorithm("api", algorithm)
            .revision(7)
            .max_cost(max_cost)
            .build()
            .expect("valid policy")
    }

    #[test]
    fn arguments_follow_the_documented_order() {
        let tb = policy(
            AlgorithmSpec::TokenBucket {
                capacity: 100,
                refill_amount: 10,
                refill_interval: Duration::from_secs(1),
            },
            10,
        );
        // scale = 1000 / gcd(10, 1000) = 100, units_per_ms = 10 / 10 = 1.
        assert_eq!(arguments(&tb), vec![7, 2000, 60_000, 100, 100, 1]);
        let gcra = policy(
            AlgorithmSpec::Gcra {
                limit: 100,
                period: Duration::from_secs(60),
                burst: 20,
            },
            5,
        );
        // g = gcd(100, 60000) = 100: units_per_ms = 1, interval_units = 600.
        assert_eq!(arguments(&gcra), vec![7, 2000, 60_000, 20, 600, 1]);
        let fw = policy(
            AlgorithmSpec::FixedWindow {
                limit: 5,
                window: Duration::from_millis(1500),
            },
            5,
        );
        assert_eq!(arguments(&fw), vec![7, 2000, 60_000, 5, 1500]);
    }
}
