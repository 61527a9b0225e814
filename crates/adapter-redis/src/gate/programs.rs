//! The event-gate Lua programs: one [`Script`] per program (name, SHA1, the commands it
//! calls), the exact source embedded at compile time, and the arguments each gate sends.
//!
//! They run like the rate-limit programs (`EVALSHA` of the SHA1 computed once, `EVAL` of the
//! same source after `NOSCRIPT`) and follow the same reply discipline: fixed arity, a status
//! first, integers in `0..=2^53-1`. KEYS, ARGV and replies are documented in each file's
//! header (`gate-submit-v1.lua` describes the eight KEYS all of them share).

use shared_contract::gate::GateSettings;

use crate::commands;
use crate::script::{Script, embedded};

/// Receives one event.
pub static SUBMIT: Script = embedded!(
    "gate-submit-v1.lua",
    &[
        &commands::TIME,
        &commands::GET,
        &commands::INCR,
        &commands::HGET,
        &commands::HMGET,
        &commands::HSET,
        &commands::HDEL,
        &commands::HLEN,
        &commands::ZADD,
        &commands::ZREM,
        &commands::ZRANGEBYSCORE,
        &commands::XADD,
        &commands::XREVRANGE,
    ]
);
/// Publishes a bounded batch of due events.
pub static PUBLISH: Script = embedded!(
    "gate-publish-v1.lua",
    &[
        &commands::TIME,
        &commands::GET,
        &commands::INCR,
        &commands::HGET,
        &commands::HMGET,
        &commands::HSET,
        &commands::ZADD,
        &commands::ZREM,
        &commands::ZRANGE,
        &commands::ZRANGEBYSCORE,
        &commands::XADD,
        &commands::XREVRANGE,
    ]
);
/// The conditional delete: terminal events past retention, lapsed windows.
pub static SWEEP: Script = embedded!(
    "gate-sweep-v1.lua",
    &[
        &commands::TIME,
        &commands::GET,
        &commands::HMGET,
        &commands::HSET,
        &commands::HDEL,
        &commands::ZREM,
        &commands::ZRANGEBYSCORE,
    ]
);
/// Reads the clock and the incubating events atomically.
pub static SNAPSHOT: Script = embedded!(
    "gate-snapshot-v1.lua",
    &[&commands::GET, &commands::HMGET, &commands::ZRANGE]
);
/// Reads the stream after a cursor.
pub static UPDATES: Script = embedded!(
    "gate-updates-v1.lua",
    &[
        &commands::GET,
        &commands::EXISTS,
        &commands::XRANGE,
        &commands::XINFO_STREAM
    ]
);

/// Every gate program of this build.
pub static GATE_PROGRAMS: [&Script; 5] = [&SUBMIT, &PUBLISH, &SWEEP, &SNAPSHOT, &UPDATES];

/// Every gate program's script, as the gate provider preloads them and the ACL check covers
/// them.
pub(crate) fn scripts() -> Vec<&'static Script> {
    GATE_PROGRAMS.to_vec()
}

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
    use crate::acl::Needs;
    use crate::acl::tests::{names, probe_key};

    #[test]
    fn acl_needs_cover_the_gate_programs_and_what_the_provider_sends() {
        let gates = Needs::gates("rl", &scripts());
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
        // The probe key sits under the prefix, in the layout of the gate provider's keys.
        assert!(probe_key(&gates).starts_with("rl:gate:{"));
    }

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
            assert_eq!(times, usize::from(p.reads_time()), "{}", p.name);
            assert_eq!(p.test_variant().is_ok(), p.reads_time(), "{}", p.name);
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
    fn every_manifest_declares_exactly_the_commands_its_source_calls() {
        for p in GATE_PROGRAMS {
            crate::script::tests::assert_declares_its_calls(p);
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
