//! The Redis gate provider: settings, the background publisher, and `EventGatePort`.
//!
//! ## Connections and certainty
//!
//! The provider owns a `Pool` of supervised, multiplexed connections, built by the same
//! code as the rate-limit provider's (connect in the background, version check, preload of
//! the gate programs, replacement of a dead or stuck link). A submission, publication or
//! sweep follows [`crate::failure`]: refused before dispatch is `Unavailable`, a lost or late
//! reply after dispatch is `Indeterminate` (a retried submission with the same id is then
//! safe: a held id answers `Duplicate`). A read (event, snapshot, updates) that fails changed
//! nothing, so it is `Unavailable(connect)`, never `Indeterminate`.
//!
//! ## Publisher
//!
//! [`RedisGateProvider::connect`] starts one publisher task per gate (unless
//! [`RedisGateSettings::run_publisher`] is off). It calls `gate-publish-v1.lua` with a bounded
//! batch; while a batch comes back full it calls again at once, otherwise it sleeps until the
//! earliest publish time the program reported (by server time), at most
//! [`RedisGateSettings::publish_interval`]. Every [`RedisGateSettings::sweep_interval`] it also
//! runs the conditional delete. Because finding an event due and publishing it are one atomic
//! program, any number of instances may publish at once: each event is published exactly
//! once, and when an instance dies the others' next call publishes what it left.
//! [`RedisGateProvider::shutdown`] stops the publishers between two calls; dropping the
//! provider aborts them (a program that was sent runs to its end or not at all).
//!
//! ## Least privilege
//!
//! Gate keys live under the same `key_prefix` as the rate-limit keys
//! (`<prefix>:gate:{<gate>}:<part>`), so `~<prefix>:*` covers them. Besides the rate-limit
//! provider's commands the gate programs call `+get +incr +hget +hmget +hset +hdel +hlen
//! +zadd +zrem +zrange +zrangebyscore +xadd +xrange +xrevrange +xinfo|stream +exists
//! +time`, and the event lookup sends `HGET` directly. Each program manifest lists its
//! commands, and every new connection is checked against them before use ([`crate::acl`]):
//! a refused command would otherwise stop a program after some of its writes (Redis does
//! not undo them), leaving, say, an event submitted without its stream entry. A user that
//! lacks any of them makes the pool `Incompatible` and `readiness()` names what is missing.
//!
//! ## Updates
//!
//! `updates_after` reads the stream with `gate-updates-v1.lua`, which never blocks: a blocking
//! `XREAD` would stall every request pipelined on the same connection. With nothing new it
//! polls every [`RedisGateSettings::updates_poll`] until the caller's deadline is near.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use shared_contract::gate::{
    EventGatePort, EventId, EventRecord, GateClock, GateId, GateOutcome, GateRequestError, GateSet,
    GateSettings, Snapshot, SubmitOutcome, SubmitRequest, UpdateBatch,
};
use shared_contract::{Deadline, IncompatibleCategory, Readiness, UnavailableCategory};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::keys::GateKeys;
use super::programs;
use super::reply::{self, Published, ReplyError};
use super::stored::{self, StoredSettingsMismatch};
use crate::acl::Needs;
use crate::error::{Error, SettingsProblem, SettingsProblems};
use crate::failure::Failure;
use crate::keys::hash_slot;
use crate::placement::Placement;
use crate::pool::Pool;
use crate::resp;
use crate::script::{Script, ScriptArgs};
use crate::settings::RedisSettings;

/// Tunables of the gate provider beside the connection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisGateSettings {
    /// Start the background publisher (default true). Off: publication happens only when
    /// someone calls `publish_due` (tests, or an external scheduler).
    pub run_publisher: bool,
    /// Longest sleep of the publisher between two calls (default 10 ms); it sleeps less when
    /// an event is due sooner.
    pub publish_interval: Duration,
    /// Events published per program call (default 1 000).
    pub publish_batch: NonZeroUsize,
    /// Time between two conditional deletes of a gate (default 1 s).
    pub sweep_interval: Duration,
    /// Events (and windows) removed per conditional delete (default 1 000).
    pub sweep_batch: NonZeroUsize,
    /// `XADD MAXLEN ~` bound of each gate's stream (default 100 000 updates).
    pub stream_max_len: u64,
    /// Poll interval of `updates_after` while nothing is new (default 5 ms).
    pub updates_poll: Duration,
}

impl Default for RedisGateSettings {
    fn default() -> Self {
        Self {
            run_publisher: true,
            publish_interval: Duration::from_millis(10),
            publish_batch: NonZeroUsize::new(1000).unwrap_or(NonZeroUsize::MIN),
            sweep_interval: Duration::from_secs(1),
            sweep_batch: NonZeroUsize::new(1000).unwrap_or(NonZeroUsize::MIN),
            stream_max_len: 100_000,
            updates_poll: Duration::from_millis(5),
        }
    }
}

impl RedisGateSettings {
    /// Largest accepted batch (the programs refuse more).
    pub const MAX_BATCH: usize = 100_000;
    /// Largest accepted stream bound.
    pub const MAX_STREAM_LEN: u64 = (1 << 40) - 1;

    /// Longest accepted interval (`publish_interval`, `sweep_interval`, `updates_poll`).
    pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

    /// Checks every tunable.
    ///
    /// # Errors
    /// Every problem found, each named by its field (`publish_batch`, `updates_poll`, ...).
    pub fn validate(&self) -> Result<(), SettingsProblems> {
        let mut problems = Vec::new();
        for (field, n) in [
            ("publish_batch", self.publish_batch),
            ("sweep_batch", self.sweep_batch),
        ] {
            if n.get() > Self::MAX_BATCH {
                problems.push(SettingsProblem::new(
                    field,
                    format!("must be between 1 and {}, got {n}", Self::MAX_BATCH),
                ));
            }
        }
        if self.stream_max_len == 0 || self.stream_max_len > Self::MAX_STREAM_LEN {
            problems.push(SettingsProblem::new(
                "stream_max_len",
                format!(
                    "must be between 1 and {}, got {}",
                    Self::MAX_STREAM_LEN,
                    self.stream_max_len
                ),
            ));
        }
        for (field, d) in [
            ("publish_interval", self.publish_interval),
            ("sweep_interval", self.sweep_interval),
            ("updates_poll", self.updates_poll),
        ] {
            if d.is_zero() || d > Self::MAX_INTERVAL {
                problems.push(SettingsProblem::new(
                    field,
                    format!(
                        "must be > 0 and at most {:?}, got {d:?}",
                        Self::MAX_INTERVAL
                    ),
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SettingsProblems(problems))
        }
    }
}

/// Everything one gate needs per request, computed once.
#[derive(Debug)]
struct Plan {
    gate: GateSettings,
    keys: GateKeys,
    /// The cluster slot of every key of the gate (they share the gate's hash tag).
    slot: u16,
    /// Mode, duration, max clock regression.
    common: [String; 3],
    /// Whether a stored-settings mismatch of this gate was logged (once per occurrence).
    mismatch_logged: std::sync::atomic::AtomicBool,
}

/// The gates, their plans and the connections: what the port and the publisher tasks share.
struct Gates {
    settings: RedisSettings,
    gate_settings: RedisGateSettings,
    gates: GateSet,
    plans: HashMap<GateId, Plan>,
    pool: Pool,
}

/// Whether a failure after dispatch may have changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Write,
    Read,
}

/// One gate program call: the gate's eight keys, then the program's arguments.
struct GateCall<'a> {
    plan: &'a Plan,
    args: &'a [&'a str],
    effect: Effect,
}

impl ScriptArgs for GateCall<'_> {
    fn count(&self) -> usize {
        1 + self.plan.keys.all().len() + self.args.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        let keys = self.plan.keys.all();
        resp::write_bulk_u64(out, keys.len() as u64);
        for k in keys {
            resp::write_bulk(out, k.as_bytes());
        }
        for a in self.args {
            resp::write_bulk(out, a.as_bytes());
        }
    }

    /// A read wrote nothing to wait for.
    fn needs_ack(&self, _: &Value) -> bool {
        self.effect == Effect::Write
    }
}

impl Gates {
    fn unavailable<T>(&self, category: UnavailableCategory) -> GateOutcome<T> {
        GateOutcome::Unavailable {
            retry_after_ms: self.settings.retry_after_ms(),
            category,
        }
    }

    fn failure<T>(&self, f: Failure, effect: Effect) -> GateOutcome<T> {
        match (f, effect) {
            (Failure::Unavailable(category), _) => self.unavailable(category),
            (Failure::Incompatible(category), _) => GateOutcome::Incompatible { category },
            (Failure::Indeterminate | Failure::NoScript, Effect::Write) => {
                GateOutcome::Indeterminate {
                    retry_after_ms: self.settings.retry_after_ms(),
                }
            }
            (Failure::Indeterminate | Failure::NoScript, Effect::Read) => {
                self.unavailable(UnavailableCategory::Connect)
            }
        }
    }

    fn plan(&self, gate: &GateId) -> Result<&Plan, GateRequestError> {
        self.gates.admit(gate)?;
        self.plans
            .get(gate)
            .ok_or_else(|| GateRequestError::UnknownGate(gate.clone()))
    }

    /// Runs `program` once (plus `EVAL` after `NOSCRIPT`) within the command timeout, after
    /// the deadline, admission and connection checks; the reply value or the outcome that
    /// replaces it.
    async fn run<T>(
        &self,
        program: &Script,
        plan: &Plan,
        args: &[&str],
        deadline: Deadline,
        effect: Effect,
    ) -> Result<Value, GateOutcome<T>> {
        let timeout = self.settings.command_timeout;
        let _permit = self
            .pool
            .admit(deadline, timeout)
            .map_err(|category| self.unavailable(category))?;
        let call = GateCall { plan, args, effect };
        match self
            .pool
            .run_script(program, plan.slot, &call, timeout)
            .await
        {
            // With `min_replicas_ack`, a write the replicas did not acknowledge may be lost
            // on failover: report it as not known to have happened.
            Ok(reply)
                if effect == Effect::Write && !reply.durable(self.settings.min_replicas_ack) =>
            {
                Err(self.failure(Failure::Indeterminate, effect))
            }
            Ok(reply) => Ok(reply.value),
            Err(f) => Err(self.failure(f, effect)),
        }
    }

    /// The gates whose stored state holds another mode or duration than configured (two
    /// `HGET`s of each meta hash, the command the event lookup sends). Each mismatch is
    /// logged at error level when first seen, and again if it comes back after it was gone.
    ///
    /// # Errors
    /// Why the stored settings could not be read.
    async fn stored_settings(&self) -> Result<Vec<StoredSettingsMismatch>, String> {
        use std::sync::atomic::Ordering;
        let timeout = self.settings.command_timeout;
        let mut out = Vec::new();
        for plan in self.plans.values() {
            let field = async |name: &str| {
                let cmd = redis::cmd("HGET").arg(plan.keys.meta()).arg(name).clone();
                match self.pool.run_command(&cmd, plan.slot, timeout).await {
                    Ok(Value::Nil) => Ok(None),
                    Ok(Value::BulkString(b)) => Ok(Some(b)),
                    Ok(_) => Err(format!(
                        "gate {}: meta hash is not a hash of strings",
                        plan.gate.id()
                    )),
                    Err(f) => Err(format!(
                        "gate {}: reading its stored settings failed ({f:?})",
                        plan.gate.id()
                    )),
                }
            };
            let mode = field("mode").await?;
            let duration = field("duration").await?;
            let mismatch = stored::compare(&plan.gate, mode.as_deref(), duration.as_deref());
            let logged = plan
                .mismatch_logged
                .swap(mismatch.is_some(), Ordering::Relaxed);
            if let Some(m) = mismatch {
                if !logged {
                    tracing::error!(gate = %m.gate, "{m}");
                }
                out.push(m);
            }
        }
        Ok(out)
    }

    fn parsed<T>(&self, what: &str, r: Result<GateOutcome<T>, ReplyError>) -> GateOutcome<T> {
        r.unwrap_or_else(|e| {
            tracing::warn!(program = what, error = %e, "unusable gate reply");
            GateOutcome::Incompatible {
                category: IncompatibleCategory::Reply,
            }
        })
    }

    async fn publish(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<Published>, GateRequestError> {
        let plan = self.plan(gate)?;
        let batch = max_batch.get().min(RedisGateSettings::MAX_BATCH);
        let (batch_s, max_len) = (
            batch.to_string(),
            self.gate_settings.stream_max_len.to_string(),
        );
        let [mode, duration, regression] = &plan.common;
        let args = [mode.as_str(), duration, regression, &batch_s, &max_len];
        Ok(
            match self
                .run(&programs::PUBLISH, plan, &args, deadline, Effect::Write)
                .await
            {
                Ok(v) => self.parsed(programs::PUBLISH.name, reply::publish(&v, batch)),
                Err(o) => o,
            },
        )
    }
}

/// Stops the publisher tasks: gracefully through [`RedisGateProvider::shutdown`], by abort
/// when the provider is dropped.
struct Publishers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Publishers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The Redis provider of [`EventGatePort`].
pub struct RedisGateProvider {
    shared: Arc<Gates>,
    publishers: tokio::sync::Mutex<Option<Publishers>>,
}

impl fmt::Debug for RedisGateProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisGateProvider")
            .field("settings", &self.shared.settings)
            .field("gate_settings", &self.shared.gate_settings)
            .field("gates", &self.shared.plans.len())
            .finish_non_exhaustive()
    }
}

impl RedisGateProvider {
    /// Checks the settings, starts the connection supervisors (waiting at most
    /// `connect_timeout` for a first connection; an unreachable server is not an error) and,
    /// unless disabled, one publisher task per gate.
    ///
    /// Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`Error`] naming the bad setting.
    pub async fn connect(
        settings: RedisSettings,
        gates: GateSet,
        gate_settings: RedisGateSettings,
    ) -> Result<Self, Error> {
        gate_settings.validate().map_err(Error::GateSettings)?;
        let resolved = settings.resolve().map_err(Error::Settings)?;
        let mut plans = HashMap::new();
        for g in gates.iter() {
            let keys = GateKeys::new(&settings.key_prefix, g.id())?;
            plans.insert(
                g.id().clone(),
                Plan {
                    gate: g.clone(),
                    slot: hash_slot(keys.stream().as_bytes()),
                    keys,
                    common: programs::common_arguments(g),
                    mismatch_logged: std::sync::atomic::AtomicBool::new(false),
                },
            );
        }
        let scripts = programs::scripts();
        let needs = Needs::gates(&settings.key_prefix, &scripts).for_settings(&settings);
        let pool = Pool::start(&settings, resolved, scripts, needs, Placement::default()).await;
        let shared = Arc::new(Gates {
            settings,
            gate_settings,
            gates,
            plans,
            pool,
        });
        let weak = Arc::downgrade(&shared);
        tokio::spawn(stored::check_at_start(move || {
            let shared = weak.upgrade()?;
            Some(Box::pin(async move { shared.stored_settings().await }) as stored::Attempt)
        }));
        let publishers = gate_settings.run_publisher.then(|| {
            let (stop, stopped) = watch::channel(false);
            let tasks = shared
                .plans
                .keys()
                .map(|g| tokio::spawn(publisher(shared.clone(), g.clone(), stopped.clone())))
                .collect();
            Publishers { stop, tasks }
        });
        Ok(Self {
            shared,
            publishers: tokio::sync::Mutex::new(publishers),
        })
    }

    /// Stops the background publishers after their current call and waits for them. Other
    /// instances (or explicit `publish_due` calls) keep publishing; nothing is lost.
    pub async fn shutdown(&self) {
        let publishers = self.publishers.lock().await.take();
        if let Some(mut p) = publishers {
            let _ = p.stop.send(true);
            for t in std::mem::take(&mut p.tasks) {
                let _ = t.await;
            }
        }
    }

    /// The gates whose stored state holds another mode or duration than configured; each is
    /// logged at error level when first seen. Start-up calls it once the pool is up.
    ///
    /// # Errors
    /// Why the stored settings could not be read (not connected, a failed command).
    pub async fn stored_settings_mismatches(&self) -> Result<Vec<StoredSettingsMismatch>, String> {
        self.shared.stored_settings().await
    }

    /// The eight physical keys of `gate`, in KEYS order (for tests and operators).
    pub fn keys(&self, gate: &GateId) -> Option<&[String; 8]> {
        self.shared.plans.get(gate).map(|p| p.keys.all())
    }

    /// The settings this provider runs with.
    pub fn settings(&self) -> (&RedisSettings, &RedisGateSettings) {
        (&self.shared.settings, &self.shared.gate_settings)
    }
}

/// One gate's publisher: publish due events, sleep until the next is due (bounded), sweep now
/// and then, until told to stop.
async fn publisher(shared: Arc<Gates>, gate: GateId, mut stop: watch::Receiver<bool>) {
    let gs = shared.gate_settings;
    // Room for the command timeout (the provider refuses a call whose deadline is shorter),
    // within the longest deadline the contract allows.
    let budget = (shared.settings.command_timeout * 4)
        .clamp(Duration::from_millis(100), Deadline::MAX_BUDGET);
    if budget <= shared.settings.command_timeout {
        tracing::error!(gate = %gate, "command_timeout leaves no deadline budget; the gate publisher does not run");
        return;
    }
    let mut next_sweep = Instant::now() + gs.sweep_interval;
    let mut wait = Duration::ZERO;
    loop {
        if !wait.is_zero() {
            tokio::select! {
                _ = stop.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        if *stop.borrow() {
            return;
        }
        let Ok(deadline) = Deadline::within(budget) else {
            // Unreachable: `budget` is within 100 ms..=MAX_BUDGET.
            return;
        };
        wait = match shared.publish(&gate, gs.publish_batch, deadline).await {
            Ok(GateOutcome::Evaluated(p)) if p.count >= gs.publish_batch.get() => Duration::ZERO,
            Ok(GateOutcome::Evaluated(p)) => match p.next_due_ms {
                Some(due) => Duration::from_millis(due.saturating_sub(p.effective_now_ms))
                    .min(gs.publish_interval),
                None => gs.publish_interval,
            },
            other => {
                tracing::debug!(gate = %gate, outcome = ?other.map(|o| o.map(|_| ())), "gate publisher call failed");
                gs.publish_interval
            }
        };
        if Instant::now() >= next_sweep {
            next_sweep = Instant::now() + gs.sweep_interval;
            if let Ok(deadline) = Deadline::within(budget) {
                let _ = sweep(&shared, &gate, gs.sweep_batch, deadline).await;
            }
        }
    }
}

async fn sweep(
    shared: &Gates,
    gate: &GateId,
    max_batch: NonZeroUsize,
    deadline: Deadline,
) -> Result<GateOutcome<usize>, GateRequestError> {
    let plan = shared.plan(gate)?;
    let batch = max_batch.get().min(RedisGateSettings::MAX_BATCH);
    let batch_s = batch.to_string();
    let retention = plan.gate.retention_ms().to_string();
    let [mode, duration, regression] = &plan.common;
    let args = [mode.as_str(), duration, regression, &retention, &batch_s];
    Ok(
        match shared
            .run(&programs::SWEEP, plan, &args, deadline, Effect::Write)
            .await
        {
            Ok(v) => shared.parsed(programs::SWEEP.name, reply::sweep(&v, batch)),
            Err(o) => o,
        },
    )
}

#[async_trait::async_trait]
impl EventGatePort for RedisGateProvider {
    fn gates(&self) -> &GateSet {
        &self.shared.gates
    }

    async fn submit(
        &self,
        request: SubmitRequest,
    ) -> Result<GateOutcome<SubmitOutcome>, GateRequestError> {
        let shared = &self.shared;
        let plan = shared.plan(&request.gate)?;
        let max_events = plan.gate.max_events().to_string();
        let max_len = shared.gate_settings.stream_max_len.to_string();
        let [mode, duration, regression] = &plan.common;
        let args = [
            mode.as_str(),
            duration,
            regression,
            &max_events,
            &max_len,
            request.key.as_str(),
            request.id.as_str(),
        ];
        Ok(
            match shared
                .run(
                    &programs::SUBMIT,
                    plan,
                    &args,
                    request.deadline,
                    Effect::Write,
                )
                .await
            {
                Ok(v) => shared.parsed(
                    programs::SUBMIT.name,
                    reply::submit_of(&v, &plan.gate, &request.id, &request.key),
                ),
                Err(o) => o,
            },
        )
    }

    async fn event(
        &self,
        gate: &GateId,
        id: &EventId,
        deadline: Deadline,
    ) -> Result<GateOutcome<Option<EventRecord>>, GateRequestError> {
        let shared = &self.shared;
        let plan = shared.plan(gate)?;
        let timeout = shared.settings.command_timeout;
        let _permit = match shared.pool.admit(deadline, timeout) {
            Ok(permit) => permit,
            Err(category) => return Ok(shared.unavailable(category)),
        };
        let cmd = redis::cmd("HGET")
            .arg(plan.keys.events())
            .arg(id.as_str())
            .clone();
        let value = match shared.pool.run_command(&cmd, plan.slot, timeout).await {
            Ok(v) => v,
            Err(f) => return Ok(shared.failure(f, Effect::Read)),
        };
        Ok(match value {
            Value::Nil => GateOutcome::Evaluated(None),
            Value::BulkString(b) => shared.parsed(
                "HGET events",
                reply::record(id, &b).map(|r| {
                    if &r.id == id {
                        GateOutcome::Evaluated(Some(r))
                    } else {
                        GateOutcome::Incompatible {
                            category: IncompatibleCategory::Reply,
                        }
                    }
                }),
            ),
            _ => GateOutcome::Incompatible {
                category: IncompatibleCategory::Reply,
            },
        })
    }

    async fn snapshot(
        &self,
        gate: &GateId,
        deadline: Deadline,
    ) -> Result<GateOutcome<Snapshot>, GateRequestError> {
        let shared = &self.shared;
        let plan = shared.plan(gate)?;
        let [mode, duration, _] = &plan.common;
        let args = [mode.as_str(), duration];
        Ok(
            match shared
                .run(&programs::SNAPSHOT, plan, &args, deadline, Effect::Read)
                .await
            {
                Ok(v) => shared.parsed(programs::SNAPSHOT.name, reply::snapshot(&v)),
                Err(o) => o,
            },
        )
    }

    async fn updates_after(
        &self,
        gate: &GateId,
        after: GateClock,
        max: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<UpdateBatch>, GateRequestError> {
        let shared = &self.shared;
        let plan = shared.plan(gate)?;
        let max = max.get().min(RedisGateSettings::MAX_BATCH);
        let (after_s, max_s) = (after.get().to_string(), max.to_string());
        let args = [after_s.as_str(), &max_s];
        let poll = shared.gate_settings.updates_poll;
        let mut first = true;
        loop {
            let left = deadline.remaining_from(Instant::now());
            if !first && left < shared.settings.command_timeout + poll {
                return Ok(GateOutcome::Evaluated(UpdateBatch::Updates(Vec::new())));
            }
            first = false;
            let outcome = match shared
                .run(&programs::UPDATES, plan, &args, deadline, Effect::Read)
                .await
            {
                Ok(v) => shared.parsed(programs::UPDATES.name, reply::updates(&v, after, max)),
                Err(o) => o,
            };
            match outcome {
                GateOutcome::Evaluated(UpdateBatch::Updates(u)) if u.is_empty() => {}
                other => return Ok(other),
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn publish_due(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        Ok(self
            .shared
            .publish(gate, max_batch, deadline)
            .await?
            .map(|p| p.count))
    }

    async fn sweep(
        &self,
        gate: &GateId,
        max_batch: NonZeroUsize,
        deadline: Deadline,
    ) -> Result<GateOutcome<usize>, GateRequestError> {
        sweep(&self.shared, gate, max_batch, deadline).await
    }

    /// `Ready` when a connection is up, answers `PING`, its ACL user may run every gate
    /// command, and every gate's stored state (if any) has the configured mode and duration.
    async fn readiness(&self) -> Readiness {
        let shared = &self.shared;
        if let Readiness::NotReady(why) =
            shared.pool.readiness(shared.settings.command_timeout).await
        {
            return Readiness::NotReady(why);
        }
        match shared.stored_settings().await {
            Ok(m) if m.is_empty() => Readiness::Ready,
            Ok(m) => Readiness::NotReady(
                m.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            Err(why) => Readiness::NotReady(format!("redis: {why}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_tunables_out_of_range_are_refused_by_field() {
        assert!(RedisGateSettings::default().validate().is_ok());
        let bad = RedisGateSettings {
            publish_batch: NonZeroUsize::new(RedisGateSettings::MAX_BATCH + 1)
                .unwrap_or(NonZeroUsize::MIN),
            stream_max_len: 0,
            updates_poll: Duration::ZERO,
            sweep_interval: RedisGateSettings::MAX_INTERVAL + Duration::from_millis(1),
            ..RedisGateSettings::default()
        };
        let problems = bad.validate().expect_err("out of range");
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "publish_batch",
                "stream_max_len",
                "sweep_interval",
                "updates_poll"
            ]
        );
        let shown = Error::GateSettings(problems).to_string();
        assert!(
            shown.starts_with("event_gates.redis.publish_batch: must be between 1 and 100000"),
            "{shown}"
        );
    }
}
