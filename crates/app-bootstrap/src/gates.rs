//! Composition of the event gates: validated [`GateSet`] -> the gate provider the rate-limit
//! provider choice names, plus the publisher that runs it.
//!
//! ```text
//! rate_limit.provider = "redis" (enabled):  RedisGateProvider on [rate_limit.redis]
//!                                           (it runs its own publisher and conditional delete)
//! otherwise:                                LocalGateProvider + a publisher task here
//! ```
//!
//! The key design decision: **no gate configured means nothing exists**, as for rate
//! limiting: [`build_gates`] answers `None`, and no provider, connection or task is created.
//! Rate limiting disabled but gates configured: the gates are local (a disabled limiter has
//! no Redis settings to share).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use adapter_local::LocalGateProvider;
use adapter_redis::{RedisGateProvider, RedisGateSettings};
use shared_contract::gate::{EventGatePort, GateOutcome, GateSet};
use shared_contract::{Deadline, SystemClock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::compose::BuildError;
use crate::settings::{ProviderSettings, RateLimitSettings, Settings};

/// How often the local publisher publishes due events (and sweeps, every 100th round).
pub const LOCAL_PUBLISH_INTERVAL: Duration = Duration::from_millis(10);
/// Events the local publisher publishes or removes per gate per call.
const LOCAL_BATCH: usize = 1024;

/// The running gates: the port and what stops its background work.
#[derive(Debug)]
pub struct GateRuntime {
    port: Arc<dyn EventGatePort>,
    provider: &'static str,
    budget: Duration,
    stop: Stop,
}

#[derive(Debug)]
enum Stop {
    /// The local publisher task and the sender that stops it.
    Local(
        watch::Sender<bool>,
        tokio::sync::Mutex<Option<JoinHandle<()>>>,
    ),
    Redis(Arc<RedisGateProvider>),
}

impl GateRuntime {
    /// The gate port.
    pub fn port(&self) -> &Arc<dyn EventGatePort> {
        &self.port
    }

    /// `"local"` or `"redis"`.
    pub fn provider_name(&self) -> &'static str {
        self.provider
    }

    /// The deadline budget to give each gate operation.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Stops the background publisher(s) and waits for them. Idempotent.
    pub async fn shutdown(&self) {
        match &self.stop {
            Stop::Local(stop, task) => {
                let _ = stop.send(true);
                if let Some(t) = task.lock().await.take() {
                    let _ = t.await;
                }
            }
            Stop::Redis(p) => p.shutdown().await,
        }
    }
}

/// Builds the gates of `settings`: `None` when no gate is configured.
///
/// Must be called inside a Tokio runtime.
///
/// # Errors
/// [`BuildError`] when the Redis gate provider refuses its settings.
pub async fn build_gates(settings: &Settings) -> Result<Option<GateRuntime>, BuildError> {
    let gates = settings.event_gates.clone();
    if gates.is_empty() {
        return Ok(None);
    }
    let count = gates.iter().count();
    if let RateLimitSettings::Enabled(e) = &settings.rate_limit
        && let ProviderSettings::Redis(r) = &e.provider
    {
        let provider = Arc::new(
            RedisGateProvider::connect(r.redis.clone(), gates, RedisGateSettings::default())
                .await?,
        );
        tracing::info!(gates = count, "event gates: redis provider");
        return Ok(Some(GateRuntime {
            port: provider.clone(),
            provider: "redis",
            budget: (r.redis.command_timeout + Duration::from_millis(100))
                .min(Deadline::MAX_BUDGET),
            stop: Stop::Redis(provider),
        }));
    }
    let provider = Arc::new(LocalGateProvider::new(gates.clone(), Arc::new(SystemClock)));
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(local_publisher(provider.clone(), gates, stopped));
    tracing::info!(gates = count, "event gates: local provider");
    Ok(Some(GateRuntime {
        port: provider,
        provider: "local",
        budget: Duration::from_secs(1),
        stop: Stop::Local(stop, tokio::sync::Mutex::new(Some(task))),
    }))
}

/// Publishes due events of every gate every [`LOCAL_PUBLISH_INTERVAL`], so events are
/// published on time without traffic, and removes expired terminal events once a second.
async fn local_publisher(
    provider: Arc<LocalGateProvider>,
    gates: GateSet,
    mut stopped: watch::Receiver<bool>,
) {
    let batch = NonZeroUsize::new(LOCAL_BATCH).unwrap_or(NonZeroUsize::MIN);
    let mut tick = tokio::time::interval(LOCAL_PUBLISH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return,
        }
        if *stopped.borrow() {
            return;
        }
        round = round.wrapping_add(1);
        for g in gates.iter() {
            let Ok(deadline) = Deadline::within(Duration::from_secs(1)) else {
                continue;
            };
            match provider.publish_due(g.id(), batch, deadline).await {
                Ok(GateOutcome::Evaluated(_)) => {}
                Ok(other) => {
                    tracing::debug!(gate = %g.id(), outcome = other.name(), "publish_due");
                }
                Err(e) => tracing::warn!(error = %e, "publish_due"),
            }
            if round.is_multiple_of(100) {
                let _ = provider.sweep(g.id(), batch, deadline).await;
            }
        }
    }
}
