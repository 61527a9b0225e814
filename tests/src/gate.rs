//! Event-gate values and calls for tests, built in one place: gate settings, event keys and
//! ids, and the port calls whose only interesting answer is `Evaluated` (anything else fails
//! the test with the call that got it).

use std::num::NonZeroUsize;
use std::time::Duration;

use adapter_redis::{RedisGateProvider, RedisGateSettings, RedisSettings};
use shared_contract::Deadline;
use shared_contract::gate::{
    EventGatePort, EventId, EventKey, EventStatus, GateClock, GateId, GateMode, GateOutcome,
    GateSet, GateSettings, GateSpec, Snapshot, StatusUpdate, SubmitOutcome, SubmitRequest,
    UpdateBatch,
};

/// The deadline of every gate call here: 5 s, generous on a shared machine.
pub fn deadline() -> Deadline {
    Deadline::within(Duration::from_secs(5)).expect("valid deadline")
}

/// # Panics
/// When `n` is 0.
pub fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("non-zero")
}

/// # Panics
/// When `s` is not a valid gate id.
pub fn gate_id(s: &str) -> GateId {
    GateId::new(s).expect("valid gate id")
}

/// # Panics
/// When `s` is not a valid event key.
pub fn key(s: &str) -> EventKey {
    EventKey::new(s).expect("valid key")
}

/// # Panics
/// When `s` is not a valid event id.
pub fn event_id(s: &str) -> EventId {
    EventId::new(s).expect("valid id")
}

/// A gate `id` of `mode` with events lasting `duration_ms` and kept `retention_ms` after they
/// end.
///
/// # Panics
/// When the settings are invalid.
pub fn settings(id: &str, mode: GateMode, duration_ms: u64, retention_ms: u64) -> GateSettings {
    let mut spec = GateSpec::new(gate_id(id), mode, Duration::from_millis(duration_ms));
    spec.retention = Duration::from_millis(retention_ms);
    GateSettings::new(spec).expect("valid gate")
}

/// A gate id no other test run uses: `tag`, this process and a counter (a shared server
/// keeps the gates of earlier runs).
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{tag}-{pid}-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Redis settings for gate tests on `url`: prefix `gt`, and a command timeout of 1 s, generous
/// on a shared machine so the tests stay about semantics.
pub fn redis_settings(url: &str) -> RedisSettings {
    let mut s = RedisSettings::new(url);
    s.command_timeout = Duration::from_secs(1);
    s.key_prefix = "gt".to_owned();
    s
}

/// A Redis gate provider for `gates` on `url` (see [`redis_settings`]).
///
/// # Panics
/// When the settings are refused.
pub async fn redis_provider(
    url: &str,
    gates: Vec<GateSettings>,
    gs: RedisGateSettings,
) -> RedisGateProvider {
    RedisGateProvider::connect(
        redis_settings(url),
        GateSet::new(gates).expect("distinct gates"),
        gs,
    )
    .await
    .expect("valid settings")
}

/// Submits event `id` of key `k`; the answer of an evaluated submission.
///
/// # Panics
/// On an unknown gate or an outcome other than `Evaluated`.
pub async fn submit(port: &dyn EventGatePort, gate: &GateId, k: &str, id: &str) -> SubmitOutcome {
    let r = port
        .submit(SubmitRequest {
            gate: gate.clone(),
            key: key(k),
            id: event_id(id),
            deadline: deadline(),
        })
        .await
        .expect("known gate");
    match r {
        GateOutcome::Evaluated(o) => o,
        other => panic!("submit {id}: {other:?}"),
    }
}

/// The status of event `id`, `None` when the gate does not hold it.
///
/// # Panics
/// On an unknown gate or an outcome other than `Evaluated`.
pub async fn status(port: &dyn EventGatePort, gate: &GateId, id: &str) -> Option<EventStatus> {
    match port
        .event(gate, &event_id(id), deadline())
        .await
        .expect("known gate")
    {
        GateOutcome::Evaluated(r) => r.map(|r| r.status),
        other => panic!("event {id}: {other:?}"),
    }
}

/// The gate's snapshot.
///
/// # Panics
/// On an unknown gate or an outcome other than `Evaluated`.
pub async fn snapshot(port: &dyn EventGatePort, gate: &GateId) -> Snapshot {
    match port.snapshot(gate, deadline()).await.expect("known gate") {
        GateOutcome::Evaluated(s) => s,
        other => panic!("snapshot of {gate}: {other:?}"),
    }
}

/// Every update after `after` that is there now (no waiting past the first empty answer).
///
/// # Panics
/// On an unknown gate or an answer other than a batch of updates.
pub async fn drain(port: &dyn EventGatePort, gate: &GateId, after: GateClock) -> Vec<StatusUpdate> {
    let mut out: Vec<StatusUpdate> = Vec::new();
    loop {
        let cursor = out.last().map_or(after, |u| u.clock);
        let short = Deadline::within(Duration::from_millis(1100)).expect("deadline");
        match port
            .updates_after(gate, cursor, nz(500), short)
            .await
            .expect("known gate")
        {
            GateOutcome::Evaluated(UpdateBatch::Updates(u)) if u.is_empty() => return out,
            GateOutcome::Evaluated(UpdateBatch::Updates(u)) => out.extend(u),
            other => panic!("updates after {cursor}: {other:?}"),
        }
    }
}
