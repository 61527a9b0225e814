//! Composition: validated settings -> the provider, its decorators and the subject hasher,
//! and from them the middleware's [`Limiter`].
//!
//! ```text
//! local:  LocalProvider
//! redis:  RedisProvider -> CircuitBreaker (unless disabled) -> LocalFallback (fallback_local)
//! ```
//!
//! `fail_open` is not a decorator: the port's outcome stays what the provider said, and the
//! edge lets the request through because the policy's `failure_policy()` says so (so the
//! response can report the truth and the allow at once). `fail_closed` needs nothing.

use std::sync::Arc;
use std::time::Duration;

use adapter_local::LocalProvider;
use adapter_redis::RedisProvider;
use edge_middleware::{BreakerGauge, Limiter, SubjectHasher, SubjectSecret};
use shared_contract::{Clock, EdgeRateLimitPort, FailurePolicy, SystemClock};

use crate::breaker::CircuitBreaker;
use crate::fallback::LocalFallback;
use crate::settings::{EnabledSettings, ProviderSettings, RateLimitSettings};

/// Why the limiter could not be built from valid settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The Redis provider refused its settings (the message names the key).
    #[error(transparent)]
    Redis(#[from] adapter_redis::Error),
}

/// An enabled limiter: the composed port and what the edge needs around it. An application
/// that composes its own port builds the middleware's `Limiter` from it directly.
#[derive(Debug, Clone)]
pub struct RateLimitRuntime {
    port: Arc<dyn EdgeRateLimitPort>,
    hasher: SubjectHasher,
    failure_policy: FailurePolicy,
    budget: Duration,
    breaker: Option<Arc<CircuitBreaker>>,
    provider: &'static str,
    /// What a reload composes again: the providers under the decorators.
    base: Base,
}

/// The providers of a runtime, kept so that a reload puts the same stores and connections
/// behind the new policies.
#[derive(Debug, Clone)]
enum Base {
    Local(Arc<LocalProvider>),
    Redis {
        redis: Arc<RedisProvider>,
        /// The local fallback's store, once some policy asked for it; kept when a reload no
        /// longer needs it, so a later one finds its state again.
        fallback: Option<Arc<LocalProvider>>,
        clock: Arc<dyn Clock>,
        local: adapter_local::LocalSettings,
    },
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
    pub fn breaker(&self) -> Option<&Arc<CircuitBreaker>> {
        self.breaker.as_ref()
    }

    /// `"local"` or `"redis"`.
    pub fn provider_name(&self) -> &'static str {
        self.provider
    }

    /// The runtime of `settings` over this runtime's stores, connections and breaker (a
    /// configuration reload): only the policies and the failure policies change. A policy of
    /// the same id and revision keeps its state; a new revision starts empty.
    ///
    /// The provider, the subject secret and the provider's own settings are this runtime's:
    /// the caller refuses a reload that changes them ([`crate::reload`]).
    ///
    /// # Errors
    /// [`BuildError`] when the provider refuses a policy.
    pub fn with_settings(&self, settings: &EnabledSettings) -> Result<Self, BuildError> {
        let policies = settings.policies.clone();
        let mut next = self.clone();
        next.failure_policy = settings.failure_policy;
        match &self.base {
            Base::Local(local) => {
                let local = Arc::new(local.with_policies(policies));
                next.port = local.clone();
                next.base = Base::Local(local);
            }
            Base::Redis {
                redis,
                fallback,
                clock,
                local,
            } => {
                let redis = Arc::new(redis.with_policies(policies.clone())?);
                let mut port: Arc<dyn EdgeRateLimitPort> = redis.clone();
                if let Some(b) = &self.breaker {
                    let b = Arc::new(b.with_inner(port));
                    next.breaker = Some(b.clone());
                    port = b;
                }
                let fallback =
                    match fallback {
                        Some(f) => Some(Arc::new(f.with_policies(policies.clone()))),
                        None if needs_fallback(settings) => Some(Arc::new(
                            LocalProvider::fallback(policies.clone(), clock.clone(), *local),
                        )),
                        None => None,
                    };
                if let Some(f) = fallback.as_ref().filter(|_| needs_fallback(settings)) {
                    port = Arc::new(LocalFallback::new(port, f.clone()));
                }
                next.port = port;
                next.base = Base::Redis {
                    redis,
                    fallback,
                    clock: clock.clone(),
                    local: *local,
                };
            }
        }
        Ok(next)
    }

    /// The middleware's limiter over this runtime: its port, hasher, failure policy, budget and
    /// provider name, and the breaker's state gauge when there is a breaker.
    ///
    /// Registers the limiter's metrics: install the metrics recorder first.
    pub fn into_limiter(self) -> Limiter {
        let limiter = Limiter::new(self.port, self.hasher, self.failure_policy, self.budget)
            .with_provider_name(self.provider);
        match self.breaker {
            Some(breaker) => limiter.with_breaker(breaker),
            None => limiter,
        }
    }
}

/// The breaker as the edge's `/metrics` shows it.
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
/// [`BuildError`] when the provider refuses its settings.
pub async fn build(settings: &RateLimitSettings) -> Result<Option<RateLimitRuntime>, BuildError> {
    match settings {
        RateLimitSettings::Disabled => Ok(None),
        RateLimitSettings::Enabled(e) => build_enabled(e).await.map(Some),
    }
}

async fn build_enabled(e: &EnabledSettings) -> Result<RateLimitRuntime, BuildError> {
    let secret = e
        .subject_secret
        .clone()
        .unwrap_or_else(SubjectSecret::random);
    let hasher = SubjectHasher::new(&secret);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    match &e.provider {
        ProviderSettings::Local => {
            let port = Arc::new(LocalProvider::new(e.policies.clone(), clock, e.local));
            let base = Base::Local(port.clone());
            tracing::info!(
                policies = e.policies.iter().count(),
                "rate limiting enabled: local provider"
            );
            Ok(RateLimitRuntime {
                port,
                hasher,
                failure_policy: e.failure_policy,
                budget: Duration::from_secs(1),
                breaker: None,
                provider: "local",
                base,
            })
        }
        ProviderSettings::Redis(r) => {
            let redis =
                Arc::new(RedisProvider::connect(r.redis.clone(), e.policies.clone()).await?);
            let mut port: Arc<dyn EdgeRateLimitPort> = redis.clone();
            let mut breaker = None;
            if e.breaker.enabled {
                let b = Arc::new(CircuitBreaker::with_clock(port, e.breaker, clock.clone()));
                breaker = Some(b.clone());
                port = b;
            }
            // The global failure policy, or any policy's own, may ask for the fallback; the
            // decorator falls back only for the policies that do.
            let mut fallback = None;
            if needs_fallback(e) {
                let local = Arc::new(LocalProvider::fallback(
                    e.policies.clone(),
                    clock.clone(),
                    e.local,
                ));
                fallback = Some(local.clone());
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
                hasher,
                failure_policy: e.failure_policy,
                // The provider refuses a deadline shorter than its command timeout; the margin
                // covers the time between taking the deadline and the provider's check.
                budget: (r.redis.command_timeout + Duration::from_millis(100))
                    .min(shared_contract::Deadline::MAX_BUDGET),
                breaker,
                provider: "redis",
                base: Base::Redis {
                    redis,
                    fallback,
                    clock,
                    local: e.local,
                },
            })
        }
    }
}

/// Whether any policy (by its own failure policy or the global one) asks for the local
/// fallback.
fn needs_fallback(e: &EnabledSettings) -> bool {
    e.policies
        .iter()
        .any(|p| p.failure_policy() == FailurePolicy::FallbackLocal)
}
