//! The event-gate Lua programs: one manifest per program (name, SHA1, whether it reads
//! `TIME`), the exact source embedded at compile time, and the arguments each gate sends.
//!
//! They run like the rate-limit programs (`EVALSHA` of the SHA1 computed once, `EVAL` of the
//! same source after `NOSCRIPT`) and follow the same reply discipline: fixed arity, a status
//! first, integers in `0..=2^53-1`. KEYS, ARGV and replies are documented in each file's
//! header (`gate-submit-v1.lua` describes the eight KEYS all of them share).

use std::sync::LazyLock;

use shared_contract::gate::GateSettings;

use crate::acl::{self, Command};
use crate::programs::time_test_variant;

/// One event-gate program.
#[derive(Debug)]
pub struct GateProgram {
    /// File name in `lua/`, e.g. `gate-submit-v1.lua`.
    pub name: &'static str,
    /// Whether the program reads `TIME` (in one marked block, replaced by the test build).
    pub timed: bool,
    /// Every Redis command the source calls, as ACL rules name it: what the start-up ACL
    /// check asks for (a test in [`crate::acl`] holds this to the source).
    pub commands: &'static [&'static Command],
    /// The exact source sent with `EVAL` and hashed for `EVALSHA`.
    pub source: &'static str,
    sha1: LazyLock<String>,
}

impl GateProgram {
    /// Lowercase hex SHA1 of [`Self::source`], as `SCRIPT LOAD` answers it.
    pub fn sha1(&self) -> &str {
        &self.sha1
    }

    /// The source with `now` taken from the last argument (differential tests only).
    ///
    /// # Errors
    /// When the program has no well-formed `@time-source` block.
    pub fn test_variant(&self) -> Result<String, String> {
        time_test_variant(self.name, self.source)
    }
}

macro_rules! gate_program {
    ($file:literal, $timed:expr, $commands:expr) => {
        GateProgram {
            name: $file,
            timed: $timed,
            commands: $commands,
            source: include_str!(concat!("../../../../lua/", $file)),
            sha1: LazyLock::new(|| {
                sha1_smol::Sha1::from(include_str!(concat!("../../../../lua/", $file)))
                    .digest()
                    .to_string()
            }),
        }
    };
}

/// Receives one event.
pub static SUBMIT: GateProgram = gate_program!(
    "gate-submit-v1.lua",
    true,
    &[
        &acl::TIME,
        &acl::GET,
        &acl::INCR,
        &acl::HGET,
        &acl::HMGET,
        &acl::HSET,
        &acl::HDEL,
        &acl::HLEN,
        &acl::ZADD,
        &acl::ZREM,
        &acl::ZRANGEBYSCORE,
        &acl::XADD,
        &acl::XREVRANGE,
    ]
);
/// Publishes a bounded batch of due events.
pub static PUBLISH: GateProgram = gate_program!(
    "gate-publish-v1.lua",
    true,
    &[
        &acl::TIME,
        &acl::GET,
        &acl::INCR,
        &acl::HGET,
        &acl::HMGET,
        &acl::HSET,
        &acl::ZADD,
        &acl::ZREM,
        &acl::ZRANGE,
        &acl::ZRANGEBYSCORE,
        &acl::XADD,
        &acl::XREVRANGE,
    ]
);
/// The conditional delete: terminal events past retention, lapsed windows.
pub static SWEEP: GateProgram = gate_program!(
    "gate-sweep-v1.lua",
    true,
    &[
        &acl::TIME,
        &acl::GET,
        &acl::HMGET,
        &acl::HSET,
        &acl::HDEL,
        &acl::ZREM,
        &acl::ZRANGEBYSCORE,
    ]
);
/// Reads the clock and the incubating events atomically.
pub static SNAPSHOT: GateProgram = gate_program!(
    "gate-snapshot-v1.lua",
    false,
    &[&acl::GET, &acl::HMGET, &acl::ZRANGE]
);
/// Reads the stream after a cursor.
pub static UPDATES: GateProgram = gate_program!(
    "gate-updates-v1.lua",
    false,
    &[&acl::GET, &acl::EXISTS, &acl::XRANGE, &acl::XINFO_STREAM]
);

/// Every gate program of this build.
pub static GATE_PROGRAMS: [&GateProgram; 5] = [&SUBMIT, &PUBLISH, &SWEEP, &SNAPSHOT, &UPDATES];

/// `ARGV[1..=3]` of every mutating program: mode, duration, max clock regression.
pub fn common_arguments(gate: &GateSettings) -> [String; 3] {
    [
        gate.mode().as_str().to_owned(),
        gate.duration_ms().to_string(),
        gate.max_clock_regression_ms().to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::gate::{GateId, GateMode, GateSpec};

    use super::*;

    #[test]
    fn manifests_match_the_files() {
        for p in GATE_PROGRAMS {
            assert!(p.name.starts_with("gate-") && p.name.ends_with("-v1.lua"));
            assert!(
                p.source.starts_with(&format!("-- {}", p.name)),
                "{}",
                p.name
            );
            assert_eq!(p.sha1().len(), 40);
            let times = p.source.matches("redis.call('TIME')").count();
            assert_eq!(times, usize::from(p.timed), "{}", p.name);
            assert_eq!(p.test_variant().is_ok(), p.timed, "{}", p.name);
            // No program gives a gate key a TTL: events never expire unhandled.
            for ttl in [
                "'EXPIRE'",
                "'PEXPIRE'",
                "'EXPIREAT'",
                "'PX'",
                "'EX'",
                "'SETEX'",
            ] {
                assert!(!p.source.contains(ttl), "{}: {ttl}", p.name);
            }
        }
    }

    #[test]
    fn common_arguments_follow_the_documented_order() {
        let mut spec = GateSpec::new(
            GateId::new("orders").expect("valid id"),
            GateMode::StrictlyOnce,
            Duration::from_millis(300),
        );
        spec.max_clock_regression = Duration::from_millis(1500);
        let g = GateSettings::new(spec).expect("valid gate");
        assert_eq!(common_arguments(&g), ["strictly_once", "300", "1500"]);
    }
}
