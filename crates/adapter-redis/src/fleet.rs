//! Fleet membership: each instance of a fleet announces itself in Redis with a heartbeat
//! (`lua/fleet-heartbeat-v1.lua`), and keeps the last known number of live instances.
//!
//! The fleet key `<prefix>:fleet:{<name>}` ([`crate::keys::fleet_key`]) is one sorted set:
//! member a random per-process instance id (32 lowercase hex), score its expiry in Unix ms by
//! the server's `TIME`. Every `heartbeat` the program drops the expired members, sets this
//! instance's expiry to `now + ttl`, and answers the number of members left: the fleet's size.
//! An instance that stops (or crashes) leaves the count within about `ttl`.
//!
//! Why keep a count at all: while Redis is down, a bounded local fallback can divide each
//! limit by the number of instances that shared it, so the fleet as a whole admits about what
//! Redis would have. The count is therefore **frozen during an outage**: a failed call, or a
//! reply this build does not understand, keeps the last known size (and logs a warning
//! naming the fleet); only a valid `{FLEET, size, now}` reply changes it.
//!
//! Counts ramp up after Redis restarts empty (each instance's next heartbeat adds it), and an
//! undercount while the fallback still decides (the circuit breaker cooling down) would give
//! each instance a larger share. So the size the fallback divides by
//! ([`FleetView::settled_size`]) only grows during the first `ttl` of heartbeats that
//! succeed in a row (every live instance has announced itself again by then), and after
//! that is the largest count of the last `ttl`: a restart never shrinks it, and an instance
//! that stopped leaves it within about `2 x ttl`.
//!
//! One background task per provider does the calls: it starts with the provider's
//! [`crate::RedisProvider::connect`] (the first heartbeat runs at once, so a started instance
//! knows its fleet as soon as Redis answers), is shared by the providers a reload makes, and is
//! aborted when the last of them is dropped. [`FleetView`] reads the count.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use shared_contract::exact::MAX_SAFE_INTEGER;
use shared_contract::{RandomTokens, TokenSource};
use tokio::time::MissedTickBehavior;

use crate::background::Tasks;
use crate::commands;
use crate::keys::{fleet_key, hash_slot};
use crate::pool::Pool;
use crate::resp;
use crate::script::{Script, ScriptArgs, embedded};

pub use crate::settings::FleetSettings;

/// The heartbeat program.
pub static HEARTBEAT: Script = embedded!(
    "fleet-heartbeat-v1.lua",
    &[
        &commands::TIME,
        &commands::ZREMRANGEBYSCORE,
        &commands::ZADD,
        &commands::ZCARD,
        &commands::PEXPIRE,
    ]
);

/// Gauge: the fleet's size, as the last successful heartbeat counted it.
pub const FLEET_SIZE_METRIC: &str = "rate_limit_fleet_size";

/// One heartbeat call: `1 key instance_id ttl_ms` after `EVALSHA sha1`.
struct HeartbeatCall<'a> {
    key: &'a str,
    instance_id: &'a str,
    ttl_ms: u64,
}

impl ScriptArgs for HeartbeatCall<'_> {
    fn count(&self) -> usize {
        4
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"$1\r\n1\r\n");
        resp::write_bulk(out, self.key.as_bytes());
        resp::write_bulk(out, self.instance_id.as_bytes());
        resp::write_bulk_u64(out, self.ttl_ms);
    }

    /// A heartbeat a failover forgets is written again by the next one: nothing to wait for.
    fn needs_ack(&self, _reply: &Value) -> bool {
        false
    }
}

/// A valid heartbeat reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatReply {
    /// Announced; `size` live members, this one included.
    Fleet {
        /// Live members of the fleet (at least 1).
        size: u64,
        /// The server's time at the heartbeat, Unix ms.
        server_now_ms: u64,
    },
    /// The fleet key holds another type; nothing written.
    StateIncompatible,
    /// The program refused an argument or the key count; nothing written.
    Invalid,
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) if *i >= 0 && (*i as u64) <= MAX_SAFE_INTEGER => Some(*i as u64),
        _ => None,
    }
}

/// Parses a heartbeat reply strictly: `{FLEET, size >= 1, now}`, or `{STATE_INCOMPATIBLE,
/// now}` / `{INVALID, now}`; integers in `0..=2^53-1`. `None` for anything else.
pub fn parse_heartbeat(value: &Value) -> Option<HeartbeatReply> {
    let Value::Array(f) = value else { return None };
    let Some(Value::BulkString(status)) = f.first() else {
        return None;
    };
    let n: Vec<u64> = f[1..].iter().map(int).collect::<Option<_>>()?;
    Some(match (status.as_slice(), n.as_slice()) {
        (b"FLEET", &[size, server_now_ms]) if size >= 1 => HeartbeatReply::Fleet {
            size,
            server_now_ms,
        },
        (b"STATE_INCOMPATIBLE", &[_]) => HeartbeatReply::StateIncompatible,
        (b"INVALID", &[_]) => HeartbeatReply::Invalid,
        _ => return None,
    })
}

/// What the heartbeat task and every [`FleetView`] share.
struct Shared {
    name: String,
    instance_id: String,
    /// The last known size; 0 until a heartbeat succeeded (a valid size is at least 1).
    size: AtomicU64,
    /// The largest size counted within the last `ttl`; 0 until a heartbeat succeeded.
    settled: AtomicU64,
    /// The counts of the last `ttl`, and since when heartbeats succeed in a row.
    recent: Mutex<Recent>,
}

/// The counts of the last `ttl`, oldest first (at most `ttl / heartbeat + 1` of them), and
/// the first success of the current run of successful heartbeats (`None` after a failure).
#[derive(Default)]
struct Recent {
    counts: VecDeque<(Instant, u64)>,
    run_since: Option<Instant>,
}

impl Shared {
    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a count made now (see the module docs for the settled size).
    fn counted(&self, size: u64, ttl: Duration) {
        self.size.store(size, Ordering::Release);
        let now = Instant::now();
        let mut recent = self.recent();
        let run_since = *recent.run_since.get_or_insert(now);
        while recent
            .counts
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > ttl)
        {
            recent.counts.pop_front();
        }
        recent.counts.push_back((now, size));
        let last_ttl = recent.counts.iter().map(|(_, n)| *n).max().unwrap_or(size);
        let settled = if now.duration_since(run_since) < ttl {
            // Instances may not all have announced themselves since Redis came back.
            last_ttl.max(self.settled.load(Ordering::Acquire))
        } else {
            last_ttl
        };
        self.settled.store(settled, Ordering::Release);
    }

    /// A heartbeat failed: the next success starts a new run.
    fn missed(&self) {
        self.recent().run_since = None;
    }
}

/// A cheap handle on one provider's fleet membership: the fleet's name, this instance's id,
/// and the last known size. Clones share it; it outlives the provider (the size then stays
/// as it was last seen).
#[derive(Clone)]
pub struct FleetView(Arc<Shared>);

impl FleetView {
    /// Live instances of the fleet, this one included, as the last successful heartbeat
    /// counted them: `None` until one succeeded. While Redis does not answer (or answers
    /// something this build does not understand) it stays at the last known count.
    pub fn size(&self) -> Option<u64> {
        match self.0.size.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }

    /// The size the local fallback divides its limits by: the largest count of the last
    /// `ttl` (as of the last successful heartbeat), `None` until one succeeded. Frozen, like
    /// [`Self::size`], while Redis does not answer.
    pub fn settled_size(&self) -> Option<u64> {
        match self.0.settled.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }

    /// The fleet's name (`FleetSettings::name`).
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// This instance's id in the fleet key: 32 lowercase hex digits, random per provider.
    pub fn instance_id(&self) -> &str {
        &self.0.instance_id
    }
}

impl fmt::Debug for FleetView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetView")
            .field("name", &self.name())
            .field("instance_id", &self.instance_id())
            .field("size", &self.size())
            .finish()
    }
}

/// The heartbeat of one provider: the view, and the task, aborted when the last clone (the
/// last provider sharing it) is dropped.
#[derive(Clone)]
pub(crate) struct Fleet {
    view: FleetView,
    _task: Arc<Tasks>,
}

/// How the task calls: the key, the program's argument, the pacing and the reply bound.
struct Beat {
    key: String,
    ttl_ms: u64,
    ttl: Duration,
    every: Duration,
    timeout: Duration,
}

impl Fleet {
    /// Starts the heartbeat of `settings` (checked) on `pool`, under key prefix `prefix`, each
    /// call bounded by `timeout`; the first call is made at once.
    ///
    /// Must be called inside a Tokio runtime.
    pub(crate) fn start(
        pool: Arc<Pool>,
        prefix: &str,
        settings: &FleetSettings,
        timeout: Duration,
    ) -> Self {
        let shared = Arc::new(Shared {
            name: settings.name.clone(),
            instance_id: RandomTokens::default().next_token().to_hex(),
            size: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            recent: Mutex::new(Recent::default()),
        });
        let beat = Beat {
            key: fleet_key(prefix, &settings.name),
            ttl_ms: settings.ttl_ms(),
            ttl: settings.ttl,
            every: settings.heartbeat,
            timeout,
        };
        let task = tokio::spawn(run(pool, shared.clone(), beat));
        Self {
            view: FleetView(shared),
            _task: Arc::new(Tasks(vec![task])),
        }
    }

    /// A handle on the count.
    pub(crate) fn view(&self) -> FleetView {
        self.view.clone()
    }
}

/// The heartbeat loop: one call every `beat.every` (the first at once), never two at once.
async fn run(pool: Arc<Pool>, shared: Arc<Shared>, beat: Beat) {
    let mut ticks = tokio::time::interval(beat.every);
    // A call that took long delays the next one rather than bunching calls up.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let gauge = metrics::gauge!(FLEET_SIZE_METRIC);
    let slot = hash_slot(beat.key.as_bytes());
    // The problem last warned about, so that an outage or a misconfiguration warns once
    // when it starts, not every heartbeat.
    let mut problem: Option<String> = None;
    loop {
        ticks.tick().await;
        let call = HeartbeatCall {
            key: &beat.key,
            instance_id: &shared.instance_id,
            ttl_ms: beat.ttl_ms,
        };
        let answer = pool.run_script(&HEARTBEAT, slot, &call, beat.timeout).await;
        let seen = match answer.map(|reply| parse_heartbeat(&reply.value)) {
            Ok(Some(HeartbeatReply::Fleet { size, .. })) => Ok(size),
            Ok(Some(HeartbeatReply::StateIncompatible)) => {
                Err("the fleet key holds another type".to_owned())
            }
            Ok(Some(HeartbeatReply::Invalid)) => {
                Err("the heartbeat program refused its arguments".to_owned())
            }
            Ok(None) => Err("a reply this build does not understand".to_owned()),
            Err(failure) => Err(format!("no answer ({failure:?})")),
        };
        match seen {
            Ok(size) => {
                shared.counted(size, beat.ttl);
                gauge.set(size as f64);
                if problem.take().is_some() {
                    tracing::info!(fleet = %shared.name, size, "fleet heartbeat answers again");
                }
            }
            Err(why) if problem.as_ref() != Some(&why) => {
                shared.missed();
                tracing::warn!(
                    fleet = %shared.name,
                    last_size = ?FleetView(shared.clone()).size(),
                    %why,
                    "fleet heartbeat failed; keeping the last known size"
                );
                problem = Some(why);
            }
            Err(why) => {
                shared.missed();
                tracing::debug!(fleet = %shared.name, %why, "fleet heartbeat failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::RedisSettings;

    fn reply(status: &str, n: &[i64]) -> Value {
        let mut v = vec![Value::BulkString(status.as_bytes().to_vec())];
        v.extend(n.iter().map(|i| Value::Int(*i)));
        Value::Array(v)
    }

    #[test]
    fn the_settled_size_is_the_largest_count_of_the_last_ttl() {
        let shared = Arc::new(Shared {
            name: "web".into(),
            instance_id: "0".repeat(32),
            size: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            recent: Mutex::new(Recent::default()),
        });
        let view = FleetView(shared.clone());
        assert_eq!((view.size(), view.settled_size()), (None, None));
        let ttl = Duration::from_millis(200);
        // Redis restarted empty: the counts ramp up again, the settled size stays.
        for n in [3, 1, 2] {
            shared.counted(n, ttl);
        }
        assert_eq!((view.size(), view.settled_size()), (Some(2), Some(3)));
        std::thread::sleep(ttl + Duration::from_millis(50));
        shared.counted(2, ttl);
        assert_eq!(view.settled_size(), Some(2), "the 3 is older than ttl");
        // After an outage longer than ttl, the first ttl of heartbeats only grows it.
        shared.missed();
        std::thread::sleep(ttl + Duration::from_millis(50));
        shared.counted(1, ttl);
        assert_eq!((view.size(), view.settled_size()), (Some(1), Some(2)));
    }

    #[test]
    fn heartbeat_replies_are_parsed_strictly() {
        assert_eq!(
            parse_heartbeat(&reply("FLEET", &[3, 1000])),
            Some(HeartbeatReply::Fleet {
                size: 3,
                server_now_ms: 1000
            })
        );
        assert_eq!(
            parse_heartbeat(&reply("STATE_INCOMPATIBLE", &[1000])),
            Some(HeartbeatReply::StateIncompatible)
        );
        assert_eq!(
            parse_heartbeat(&reply("INVALID", &[1000])),
            Some(HeartbeatReply::Invalid)
        );
        let refused = [
            reply("FLEET", &[0, 1000]),       // no member: not even this one
            reply("FLEET", &[3]),             // arity
            reply("FLEET", &[3, 1000, 1]),    // arity
            reply("FLEET", &[-3, 1000]),      // negative
            reply("FLEET", &[1 << 53, 1000]), // beyond exact integers
            reply("INVALID", &[]),
            reply("MEMBERS", &[3, 1000]),
            Value::Int(3),
            Value::Array(vec![Value::Int(3), Value::Int(1000)]),
            Value::Array(vec![
                Value::BulkString(b"FLEET".to_vec()),
                Value::BulkString(b"3".to_vec()),
                Value::Int(1000),
            ]),
        ];
        for r in refused {
            assert_eq!(parse_heartbeat(&r), None, "{r:?}");
        }
    }

    #[test]
    fn the_heartbeat_program_declares_its_calls_and_reads_time_once() {
        crate::script::tests::assert_declares_its_calls(&HEARTBEAT);
        assert_eq!(HEARTBEAT.source.matches("redis.call('TIME')").count(), 1);
        assert!(HEARTBEAT.test_variant().is_ok());
        assert!(
            HEARTBEAT
                .source
                .starts_with(&format!("-- {}", HEARTBEAT.name))
        );
    }

    #[test]
    fn a_call_is_the_key_the_instance_id_and_the_ttl() {
        let call = HeartbeatCall {
            key: "rl:fleet:{api}",
            instance_id: "0123456789abcdef0123456789abcdef",
            ttl_ms: 5000,
        };
        let mut out = Vec::new();
        HEARTBEAT.write_call(&mut out, false, &call);
        let mut want = Vec::new();
        redis::cmd("EVALSHA")
            .arg(HEARTBEAT.sha1())
            .arg(1)
            .arg("rl:fleet:{api}")
            .arg("0123456789abcdef0123456789abcdef")
            .arg(5000)
            .write_packed_command(&mut want);
        assert_eq!(out, want);
        assert_eq!(fleet_key("rl", "api"), "rl:fleet:{api}");
        assert_eq!(hash_slot(b"rl:fleet:{api}"), hash_slot(b"api"));
    }

    fn problems(fleet: FleetSettings) -> Vec<String> {
        let s = RedisSettings {
            fleet: Some(fleet),
            ..RedisSettings::new("redis://127.0.0.1:6379/0")
        };
        match s.validate() {
            Ok(()) => Vec::new(),
            Err(p) => p.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn fleet_settings_are_checked_by_name_with_the_refused_value() {
        assert_eq!(problems(FleetSettings::default()), Vec::<String>::new());
        let ms = Duration::from_millis;
        let ok = FleetSettings {
            name: "api-v2.eu_1".to_owned(),
            heartbeat: ms(100),
            ttl: ms(200),
        };
        assert_eq!(problems(ok.clone()), Vec::<String>::new());
        let cases: Vec<(FleetSettings, &str, &str)> = vec![
            (
                FleetSettings {
                    name: String::new(),
                    ..ok.clone()
                },
                "fleet.name",
                "\"\"",
            ),
            (
                FleetSettings {
                    name: "a{b}".to_owned(),
                    ..ok.clone()
                },
                "fleet.name",
                "a{b}",
            ),
            (
                FleetSettings {
                    name: "x".repeat(65),
                    ..ok.clone()
                },
                "fleet.name",
                "xxxx",
            ),
            (
                FleetSettings {
                    heartbeat: ms(99),
                    ttl: ms(1000),
                    ..ok.clone()
                },
                "fleet.heartbeat",
                "99ms",
            ),
            (
                FleetSettings {
                    heartbeat: Duration::from_secs(61),
                    ttl: Duration::from_secs(200),
                    ..ok.clone()
                },
                "fleet.heartbeat",
                "61s",
            ),
            (
                FleetSettings {
                    ttl: ms(199),
                    ..ok.clone()
                },
                "fleet.ttl",
                "199ms",
            ),
            (
                FleetSettings {
                    ttl: Duration::from_secs(601),
                    ..ok.clone()
                },
                "fleet.ttl",
                "601s",
            ),
        ];
        for (fleet, key, value) in cases {
            let found = problems(fleet);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0].contains(key) && found[0].contains(value),
                "{key}: {found:?}"
            );
        }
        assert!(FleetSettings::default().validate().is_ok());
    }
}
