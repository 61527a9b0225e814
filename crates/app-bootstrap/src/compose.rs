//! Composition: validated settings -> the provider, its decorators and the subject hasher,
//! and from them the middleware's [`Limiter`].
//!
//! ```text
//! local:  LocalProvider
//! redis:  RedisProvider -> CircuitBreaker (unless disabled) -> LocalFallback (fallback_local)
//! ```
//!
//! Each provider is built only in a build with its feature; the breaker needs `redis`, the
//! fallback `local`.
//!
//! `fail_open` is not a decorator: the port's outcome stays what the provider said, and the
//! edge lets the request through because the policy's `failure_policy()` says so (so the
//! response can report the truth and the allow at once). `fail_closed` needs nothing.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "local")]
use adapter_local::LocalProvider;
#[cfg(feature = "redis")]
use adapter_redis::RedisProvider;
#[cfg(feature = "redis")]
use edge_middleware::BreakerGauge;
#[cfg(any(feature = "local", feature = "redis"))]
use edge_middleware::SubjectSecret;
use edge_middleware::{Limiter, SubjectHasher};
#[cfg(any(feature = "local", feature = "redis"))]
use shared_contract::{Clock, SystemClock};
use shared_contract::{EdgeRateLimitPort, FailurePolicy};

#[cfg(feature = "redis")]
use crate::breaker::CircuitBreaker;
#[cfg(all(feature = "local", feature = "redis"))]
use crate::fallback::LocalFallback;
#[cfg(feature = "redis")]
use crate::features::Feature;
use crate::features::unavailable;
#[cfg(any(feature = "local", feature = "redis"))]
use crate::settings::ProviderSettings;
#[cfg(feature = "redis")]
use crate::settings::RedisProviderSettings;
use crate::settings::{EnabledSettings, RateLimitSettings};

/// Why the limiter could not be built from valid settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The Redis provider refused its settings (the message names the key).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] adapter_redis::Error),
    /// Settings built by hand (configuration refuses them) need what this build lacks: a
    /// `fallback_local` policy without the `local` feature, or local event gates.
    #[error("{}", unavailable(what, feature))]
    Unavailable {
        what: &'static str,
        /// The feature to build with.
        feature: &'static str,
    },
}

/// An enabled limiter: the composed port and what the edge needs around it. An application
/// that composes its own port builds the middleware's `Limiter` from it directly.
#[derive(Debug, Clone)]
pub struct RateLimitRuntime {
    port: Arc<dyn EdgeRateLimitPort>,
    hasher: SubjectHasher,
    failure_policy: FailurePolicy,
    budget: Duration,
    #[cfg(feature = "redis")]
    breaker: Option<Arc<CircuitBreaker>>,
    provider: &'static str,
}

impl RateLimitRuntime {
    /// The composed port (provider plus decorators).
    pub fn port(&self) -> &Arc<dyn EdgeRateLimitPort> {
        &self.port
    }

    pub fn hasher(&self) -> &SubjectHasher {
        &self.hasher
    }

    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }

    /// The deadline budget to give each evaluation.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The circuit breaker, when there is one (redis provider).
    #[cfg(feature = "redis")]
    pub fn breaker(&self) -> Option<&Arc<CircuitBreaker>> {
        self.breaker.as_ref()
    }

    /// `"local"` or `"redis"`.
    pub fn provider_name(&self) -> &'static str {
        self.provider
    }

    /// The middleware's limiter over this runtime: its port, hasher, failure policy, budget and
    /// provider name, and the breaker's state gauge when there is a breaker.
    ///
    /// Registers the limiter's metrics: install the metrics recorder first.
    pub fn into_limiter(self) -> Limiter {
        let limiter = Limiter::new(self.port, self.hasher, self.failure_policy, self.budget)
            .with_provider_name(self.provider);
        #[cfg(feature = "redis")]
        if let Some(breaker) = self.breaker {
            return limiter.with_breaker(breaker);
        }
        limiter
    }
}

/// The breaker as the edge's `/metrics` shows it.
#[cfg(feature = "redis")]
impl BreakerGauge for CircuitBreaker {
    fn gauge(&self) -> f64 {
        self.state().gauge()
    }
}

/// Builds the limiter of `settings`: `None` when rate limiting is disabled, in which case
/// nothing at all is created (no connection, no task, no port).
///
/// Must be called inside a Tokio runtime when the provider is redis.
///
/// # Errors
/// [`BuildError`] when the provider refuses its settings, or when they need what this build
/// lacks (settings built by hand; configuration refuses them).
pub async fn build(settings: &RateLimitSettings) -> Result<Option<RateLimitRuntime>, BuildError> {
    match settings {
        RateLimitSettings::Disabled => Ok(None),
        RateLimitSettings::Enabled(e) => build_enabled(e).await.map(Some),
    }
}

async fn build_enabled(e: &EnabledSettings) -> Result<RateLimitRuntime, BuildError> {
    // Without a provider feature the enum has no variant: nothing enabled exists to build.
    match e.provider {
        #[cfg(feature = "local")]
        ProviderSettings::Local => Ok(local(e)),
        #[cfg(feature = "redis")]
        ProviderSettings::Redis(ref r) => redis(e, r).await,
    }
}

/// The subject hasher of `e`: keyed with its secret, or a random per-process key.
#[cfg(any(feature = "local", feature = "redis"))]
fn hasher(e: &EnabledSettings) -> SubjectHasher {
    let secret = e
        .subject_secret
        .clone()
        .unwrap_or_else(SubjectSecret::random);
    SubjectHasher::new(&secret)
}

#[cfg(feature = "local")]
fn local(e: &EnabledSettings) -> RateLimitRuntime {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let port = Arc::new(LocalProvider::new(e.policies.clone(), clock, e.local));
    tracing::info!(
        policies = e.policies.iter().count(),
        "rate limiting enabled: local provider"
    );
    RateLimitRuntime {
        port,
        hasher: hasher(e),
        failure_policy: e.failure_policy,
        budget: Duration::from_secs(1),
        #[cfg(feature = "redis")]
        breaker: None,
        provider: "local",
    }
}

#[cfg(feature = "redis")]
async fn redis(
    e: &EnabledSettings,
    r: &RedisProviderSettings,
) -> Result<RateLimitRuntime, BuildError> {
    // The global failure policy, or any policy's own, may ask for the fallback; the decorator
    // falls back only for the policies that do. Checked before connecting: without the
    // `local` feature there is no fallback, and such settings are refused, not run fail-closed.
    let fallback = e
        .policies
        .iter()
        .any(|p| p.failure_policy() == FailurePolicy::FallbackLocal);
    if fallback && !Feature::Local.compiled() {
        return Err(BuildError::Unavailable {
            what: "failure_policy \"fallback_local\"",
            feature: Feature::Local.name(),
        });
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let redis = RedisProvider::connect(r.redis.clone(), e.policies.clone()).await?;
    let mut port: Arc<dyn EdgeRateLimitPort> = Arc::new(redis);
    let mut breaker = None;
    if e.breaker.enabled {
        let b = Arc::new(CircuitBreaker::with_clock(port, e.breaker, clock.clone()));
        breaker = Some(b.clone());
        port = b;
    }
    #[cfg(feature = "local")]
    if fallback {
        let local = LocalProvider::fallback(e.policies.clone(), clock, e.local);
        port = Arc::new(LocalFallback::new(port, local));
    }
    tracing::info!(
        policies = e.policies.iter().count(),
        failure_policy = e.failure_policy.as_str(),
        breaker = e.breaker.enabled,
        "rate limiting enabled: redis provider"
    );
    Ok(RateLimitRuntime {
        port,
        hasher: hasher(e),
        failure_policy: e.failure_policy,
        // The provider refuses a deadline shorter than its command timeout; the margin covers
        // the time between taking the deadline and the provider's check.
        budget: (r.redis.command_timeout + Duration::from_millis(100))
            .min(shared_contract::Deadline::MAX_BUDGET),
        breaker,
        provider: "redis",
    })
}
