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
    String,
    Hash,
}

impl KeyType {
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
    pub algorithm: AlgorithmKind,
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

/// Every program of this build, one per algorithm.
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

/// Every program's script, as a provider preloads them and the ACL check covers them.
pub(crate) fn scripts() -> Vec<&'static Script> {
    PROGRAMS.iter().map(|p| &p.script).collect()
}

/// The program of an algorithm.
pub fn program(kind: AlgorithmKind) -> &'static Program {
    // `PROGRAMS` has one entry per `AlgorithmKind::ALL`; the test below keeps it so.
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
    }
    args
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{
        AlgorithmSpec, FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy,
    };

    use super::*;

    #[test]
    fn every_algorithm_has_exactly_one_program() {
        for kind in AlgorithmKind::ALL {
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
        RateLimitPolicy::new(PolicySpec {
            id: PolicyId::new("api").expect("valid id"),
            revision: PolicyRevision::new(7).expect("valid revision"),
            algorithm,
            max_cost,
            cleanup_grace: Duration::from_secs(60),
            max_clock_regression: Duration::from_secs(2),
            failure_policy: FailurePolicy::FailClosed,
        })
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
