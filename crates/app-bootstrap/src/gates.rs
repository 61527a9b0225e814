//! Composition of the event gates: validated [`GateSet`] -> the gate provider the rate-limit
//! provider choice names, plus the publisher that runs it.
//!
//! ```text
//! rate_limit.provider = "redis" (enabled):  RedisGateProvider on [rate_limit.redis]
//!                                           (it runs its own publisher and conditional delete)
//! otherwise:                                LocalGateProvider + its LocalGatePublisher
//! ```
//!
//! Both providers and their publishers live in their adapters; this module only chooses and
//! composes them. The Redis provider checks the gates' stored settings itself once Redis
//! answers (a gate whose state holds another mode or duration is logged at start-up and
//! reported not ready by `readiness()`, hence `/readyz`).
//!
//! The key design decision: **no gate configured means nothing exists**, as for rate
//! limiting: [`build_gates`] answers `None`, and no provider, connection or task is created.
//! Rate limiting disabled but gates configured: the gates are local (a disabled limiter has
//! no Redis settings to share). Each provider exists only with its feature (`redis`,
//! `local`); configuration refuses gates the build cannot serve.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "local")]
use adapter_local::{LocalGateProvider, LocalGatePublisher};
#[cfg(feature = "redis")]
use adapter_redis::{RedisGateProvider, RedisGateSettings};
#[cfg(feature = "redis")]
use shared_contract::Deadline;
#[cfg(feature = "local")]
use shared_contract::SystemClock;
use shared_contract::gate::{EventGatePort, GateSet};

use crate::compose::BuildError;
use crate::settings::Settings;
#[cfg(feature = "redis")]
use crate::settings::{RateLimitSettings, RedisProviderSettings};

/// How often the local publisher publishes due events (and sweeps, every 100th round).
#[cfg(feature = "local")]
pub const LOCAL_PUBLISH_INTERVAL: Duration = LocalGatePublisher::INTERVAL;

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
    #[cfg(feature = "local")]
    Local(LocalGatePublisher, Arc<LocalGateProvider>),
    #[cfg(feature = "redis")]
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
        // Without a provider feature there is no variant, and no runtime to stop.
        match self.stop {
            #[cfg(feature = "local")]
            Stop::Local(ref publisher, _) => publisher.shutdown().await,
            #[cfg(feature = "redis")]
            Stop::Redis(ref p) => p.shutdown().await,
        }
    }
}

/// Builds the gates of `settings`: `None` when no gate is configured.
///
/// Must be called inside a Tokio runtime.
///
/// # Errors
/// [`BuildError`] when the Redis gate provider refuses its settings, or when the gates are
/// local in a build without the `local` feature (settings built by hand; configuration
/// refuses them).
pub async fn build_gates(settings: &Settings) -> Result<Option<GateRuntime>, BuildError> {
    let gates = settings.event_gates.clone();
    if gates.is_empty() {
        return Ok(None);
    }
    #[cfg(feature = "redis")]
    if let RateLimitSettings::Enabled(e) = &settings.rate_limit
        && let Some(r) = e.provider.redis()
    {
        return redis(r, gates).await.map(Some);
    }
    local(gates).map(Some)
}

#[cfg(feature = "redis")]
async fn redis(r: &RedisProviderSettings, gates: GateSet) -> Result<GateRuntime, BuildError> {
    let count = gates.iter().count();
    let provider = Arc::new(
        RedisGateProvider::connect(r.redis.clone(), gates, RedisGateSettings::default()).await?,
    );
    tracing::info!(gates = count, "event gates: redis provider");
    Ok(GateRuntime {
        port: provider.clone(),
        provider: "redis",
        budget: (r.redis.command_timeout + Duration::from_millis(100)).min(Deadline::MAX_BUDGET),
        stop: Stop::Redis(provider),
    })
}

/// The gates of `settings` after a configuration reload that changed them, `running` being
/// the gates in force: local gates are built over `running`'s events (a gate kept with the
/// same settings keeps them, see `LocalGateProvider::with_gates`); Redis gates are built
/// again, on new connections, over the events in Redis. The caller stops `running` once the
/// new gates are in force.
///
/// # Errors
/// As [`build_gates`].
pub async fn rebuild_gates(
    running: Option<&GateRuntime>,
    settings: &Settings,
) -> Result<Option<GateRuntime>, BuildError> {
    #[cfg(feature = "local")]
    if let Some(GateRuntime {
        stop: Stop::Local(_, provider),
        ..
    }) = running
        && !settings.event_gates.is_empty()
    {
        return local_over(provider.with_gates(settings.event_gates.clone())).map(Some);
    }
    #[cfg(not(feature = "local"))]
    let _ = running;
    build_gates(settings).await
}

/// The local gates (rate limiting disabled, or not on the redis provider).
#[cfg(feature = "local")]
fn local(gates: GateSet) -> Result<GateRuntime, BuildError> {
    local_over(LocalGateProvider::new(gates, Arc::new(SystemClock)))
}

#[cfg(feature = "local")]
fn local_over(provider: LocalGateProvider) -> Result<GateRuntime, BuildError> {
    let count = provider.gates().iter().count();
    let provider = Arc::new(provider);
    let publisher = LocalGatePublisher::spawn(provider.clone());
    tracing::info!(gates = count, "event gates: local provider");
    Ok(GateRuntime {
        port: provider.clone(),
        provider: "local",
        budget: Duration::from_secs(1),
        stop: Stop::Local(publisher, provider),
    })
}

#[cfg(not(feature = "local"))]
fn local(_: GateSet) -> Result<GateRuntime, BuildError> {
    Err(BuildError::Unavailable {
        what: "the local gate provider",
        feature: crate::features::Feature::Local.name(),
    })
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "local")]
    use std::num::NonZeroUsize;

    use super::*;
    use crate::config::from_toml;
    #[cfg(feature = "local")]
    use shared_contract::Deadline;
    #[cfg(feature = "local")]
    use shared_contract::gate::{
        EventId, EventKey, GateId, GateOutcome, SubmitOutcome, SubmitRequest,
    };

    fn problems(toml: &str) -> Vec<String> {
        match from_toml(toml) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[cfg(feature = "local")]
    #[test]
    fn gates_are_read_with_their_defaults_and_optional_fields() {
        let s = from_toml(
            "[event_gates.orders]\nmode = \"strictly_once\"\nduration = \"3s\"\n\
             [event_gates.b]\nmode = \"only_once\"\nduration = \"250ms\"\nretention = \"10m\"\n\
             max_events = 7\nmax_clock_regression = \"0s\"\n",
        )
        .expect("valid");
        let orders = s
            .event_gates
            .get(&GateId::new("orders").expect("id"))
            .expect("orders");
        assert_eq!(orders.duration_ms(), 3000);
        assert_eq!(orders.retention_ms(), 3_600_000);
        let b = s
            .event_gates
            .get(&GateId::new("b").expect("id"))
            .expect("b");
        assert_eq!(
            (
                b.retention_ms(),
                b.max_events(),
                b.max_clock_regression_ms()
            ),
            (600_000, 7, 0)
        );
    }

    #[test]
    fn every_gate_problem_names_its_key_path() {
        let p = problems(
            "[event_gates.orders]\nduration = \"0s\"\nmax_events = 0\n\
             [event_gates.x]\nmode = \"sometimes\"\nduration = 3\n",
        );
        for path in [
            "event_gates.orders.mode: required",
            "event_gates.x.mode: \"sometimes\" is not a mode",
            "event_gates.x.duration: must be a duration string",
        ] {
            assert!(p.iter().any(|l| l.starts_with(path)), "{path} in {p:?}");
        }
        let p =
            problems("[event_gates.o]\nmode = \"only_once\"\nduration = \"0s\"\nmax_events = 0\n");
        assert!(
            p.iter().any(|l| l.starts_with("event_gates.o.duration:")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.starts_with("event_gates.o.max_events:")),
            "{p:?}"
        );
        assert!(problems("event_gates = 3\n")[0].starts_with("event_gates: must be a table"));
    }

    #[tokio::test]
    async fn no_gate_builds_nothing() {
        let s = from_toml("").expect("valid");
        assert!(build_gates(&s).await.expect("built").is_none());
    }

    #[cfg(feature = "local")]
    #[tokio::test]
    async fn the_local_publisher_publishes_without_traffic_and_stops_on_shutdown() {
        let s = from_toml("[event_gates.g]\nmode = \"only_once\"\nduration = \"30ms\"\n")
            .expect("valid");
        let rt = build_gates(&s).await.expect("built").expect("some");
        assert_eq!(rt.provider_name(), "local");
        let gate = GateId::new("g").expect("id");
        let deadline = || Deadline::within(Duration::from_secs(1)).expect("deadline");
        let answer = rt
            .port()
            .submit(SubmitRequest {
                gate: gate.clone(),
                key: EventKey::new("k").expect("key"),
                id: EventId::new("e").expect("id"),
                deadline: deadline(),
            })
            .await
            .expect("known gate");
        assert!(matches!(
            answer,
            GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
        ));
        let clock = answer.evaluated().map(SubmitOutcome::clock).expect("clock");
        // Nobody calls the gate; the publisher's 10 ms tick must publish it. The update log
        // shows the publication (clock above the submission's) without a lazy publication by
        // a read, because `updates_after` is answered from the log.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let batch = rt
            .port()
            .updates_after(&gate, clock, NonZeroUsize::MIN, deadline())
            .await
            .expect("known gate");
        assert!(
            matches!(&batch, GateOutcome::Evaluated(shared_contract::gate::UpdateBatch::Updates(u)) if u.len() == 1),
            "{batch:?}"
        );
        rt.shutdown().await;
        rt.shutdown().await;
    }
}
