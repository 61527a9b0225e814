//! Composition: validated settings -> the provider, its decorators and the subject hasher,
//! and from them the middleware's [`Limiter`].
//!
//! ```text
//! local:  LocalProvider
//! redis:  RedisProvider -> CircuitBreaker (unless disabled) -> LocalFallback (fallback_local)
//! ```
//!
//! Each provider is built only in a build with its feature; the breaker needs `redis`, the
//! fallback `local`. One function (`stack`) puts the decorators around the redis provider, at
//! start-up and at a reload alike (which keeps the running circuit and the fallback's store).
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
use crate::fallback::{FallbackStore, FleetSize, LocalFallback};
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
        /// What was asked for that this build lacks.
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
    /// What a reload composes again: the providers under the decorators.
    base: Base,
}

/// The providers of a runtime, kept so that a reload puts the same stores and connections
/// behind the new policies. Without a provider feature it has no variant (nothing enabled
/// can be built).
#[derive(Debug, Clone)]
enum Base {
    #[cfg(feature = "local")]
    Local(Arc<LocalProvider>),
    #[cfg(feature = "redis")]
    Redis {
        redis: Arc<RedisProvider>,
        /// The local fallback's store, once some policy asked for it; kept when a reload no
        /// longer needs it, so a later one finds its state again.
        #[cfg(feature = "local")]
        fallback: Option<Arc<FallbackStore>>,
        #[cfg(feature = "local")]
        clock: Arc<dyn Clock>,
        #[cfg(feature = "local")]
        local: adapter_local::LocalSettings,
        /// `[rate_limit.fleet]`'s `size_when_unknown`, for a fallback a reload adds.
        #[cfg(feature = "local")]
        size_when_unknown: u64,
    },
}

impl RateLimitRuntime {
    /// The composed port (provider plus decorators).
    pub fn port(&self) -> &Arc<dyn EdgeRateLimitPort> {
        &self.port
    }

    /// The hasher that digests subjects: keyed with the configured secret, or a random per-process
    /// key.
    pub fn hasher(&self) -> &SubjectHasher {
        &self.hasher
    }

    /// The global failure policy (`rate_limit.failure_policy`), for a policy that sets none of its
    /// own.
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

    /// The runtime of `settings` over this runtime's stores, connections and breaker (a
    /// configuration reload): only the policies and the failure policies change. A policy of
    /// the same id and revision keeps its state; a new revision starts empty.
    ///
    /// The provider, the subject secret and the provider's own settings are this runtime's:
    /// the caller refuses a reload that changes them ([`crate::reload`]).
    ///
    /// # Errors
    /// [`BuildError`] when the provider refuses a policy, or a policy needs the local fallback
    /// in a build without the `local` feature.
    // Without a provider feature `Base` has no value: the match ends the function.
    #[cfg_attr(
        not(any(feature = "local", feature = "redis")),
        allow(unreachable_code, unused_mut, unused_variables)
    )]
    pub fn with_settings(&self, settings: &EnabledSettings) -> Result<Self, BuildError> {
        let mut next = self.clone();
        next.failure_policy = settings.failure_policy;
        match self.base {
            #[cfg(feature = "local")]
            Base::Local(ref local) => {
                let local = Arc::new(local.with_policies(settings.policies.clone()));
                next.port = local.clone();
                next.base = Base::Local(local);
            }
            #[cfg(feature = "redis")]
            Base::Redis { .. } => self.reload_redis(settings, &mut next)?,
        }
        Ok(next)
    }

    // With `redis` alone, `Base` has one variant and the `let ... else` cannot fail.
    #[cfg(feature = "redis")]
    #[allow(irrefutable_let_patterns)]
    fn reload_redis(&self, settings: &EnabledSettings, next: &mut Self) -> Result<(), BuildError> {
        #[cfg(feature = "local")]
        let Base::Redis {
            redis,
            fallback,
            clock,
            local,
            size_when_unknown,
        } = &self.base
        else {
            return Ok(());
        };
        #[cfg(not(feature = "local"))]
        let Base::Redis { redis } = &self.base else {
            return Ok(());
        };
        let needs_fallback = needs_fallback(settings)?;
        let policies = settings.policies.clone();
        let redis = Arc::new(redis.with_policies(policies.clone())?);
        // The fallback's store is kept even when no policy needs it now, so that a later
        // reload finds its state again.
        #[cfg(feature = "local")]
        let store = match fallback {
            Some(f) => Some(Arc::new(f.with_policies(policies))),
            None => needs_fallback.then(|| {
                Arc::new(fallback_store(
                    policies,
                    clock.clone(),
                    *local,
                    &redis,
                    *size_when_unknown,
                ))
            }),
        };
        #[cfg(not(feature = "local"))]
        let store: Fallback = None;
        let layers = stack(
            redis.clone(),
            |inner| self.breaker.as_ref().map(|b| b.with_inner(inner)),
            store.clone().filter(|_| needs_fallback),
        );
        next.breaker = layers.breaker;
        next.port = layers.port;
        #[cfg(feature = "local")]
        {
            next.base = Base::Redis {
                redis,
                fallback: store,
                clock: clock.clone(),
                local: *local,
                size_when_unknown: *size_when_unknown,
            };
        }
        #[cfg(not(feature = "local"))]
        {
            next.base = Base::Redis { redis };
        }
        Ok(())
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
        RateLimitSettings::Enabled(e) => build_enabled(e, &Serving::default()).await.map(Some),
    }
}

/// [`build`] for an app that serves thread per core on `serving`'s runtimes (each
/// single-threaded and driven by one thread for the app's life): the redis provider gives
/// each its own connections (`adapter_redis::placement`).
///
/// # Errors
/// As [`build`].
#[cfg(feature = "redis")]
pub async fn build_on(
    settings: &RateLimitSettings,
    serving: &[tokio::runtime::Handle],
) -> Result<Option<RateLimitRuntime>, BuildError> {
    let serving = Serving {
        placement: adapter_redis::Placement::new(serving.to_vec()),
    };
    match settings {
        RateLimitSettings::Disabled => Ok(None),
        RateLimitSettings::Enabled(e) => build_enabled(e, &serving).await.map(Some),
    }
}

/// Where the provider's connections run: the caller's runtime by default.
#[derive(Default)]
struct Serving {
    #[cfg(feature = "redis")]
    placement: adapter_redis::Placement,
}

async fn build_enabled(
    e: &EnabledSettings,
    serving: &Serving,
) -> Result<RateLimitRuntime, BuildError> {
    let _ = serving;
    // Without a provider feature the enum has no variant: nothing enabled exists to build.
    match e.provider {
        #[cfg(feature = "local")]
        ProviderSettings::Local => Ok(local(e)),
        #[cfg(feature = "redis")]
        ProviderSettings::Redis(ref r) => redis(e, r, serving).await,
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
        port: port.clone(),
        hasher: hasher(e),
        failure_policy: e.failure_policy,
        budget: Duration::from_secs(1),
        #[cfg(feature = "redis")]
        breaker: None,
        provider: "local",
        base: Base::Local(port),
    }
}

#[cfg(feature = "redis")]
async fn redis(
    e: &EnabledSettings,
    r: &RedisProviderSettings,
    serving: &Serving,
) -> Result<RateLimitRuntime, BuildError> {
    // Checked before connecting.
    let fallback = needs_fallback(e)?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut redis_settings = r.redis.clone();
    // The heartbeat runs only for the fallback's sake: a deployment without one needs no
    // fleet key and no ACL grant for it.
    if fallback {
        redis_settings.fleet = Some(e.fleet.heartbeat_settings());
    }
    let placement = serving.placement.clone();
    let redis =
        Arc::new(RedisProvider::connect_on(redis_settings, e.policies.clone(), placement).await?);
    #[cfg(feature = "local")]
    let fallback = fallback.then(|| {
        let policies = e.policies.clone();
        let size = e.fleet.size_when_unknown;
        Arc::new(fallback_store(
            policies,
            clock.clone(),
            e.local,
            &redis,
            size,
        ))
    });
    // Without `local`, settings that ask for the fallback were refused above.
    #[cfg(not(feature = "local"))]
    let fallback: Fallback = {
        let _ = fallback;
        None
    };
    let Layers { port, breaker } = stack(
        redis.clone(),
        |inner| {
            let settings = e.breaker;
            settings
                .enabled
                .then(|| CircuitBreaker::with_clock(inner, settings, clock.clone()))
        },
        fallback.clone(),
    );
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
        #[cfg(feature = "local")]
        base: Base::Redis {
            redis,
            fallback,
            clock,
            local: e.local,
            size_when_unknown: e.fleet.size_when_unknown,
        },
        #[cfg(not(feature = "local"))]
        base: Base::Redis { redis },
    })
}

/// The local fallback's store, when the stack has the fallback (a policy asks for it).
#[cfg(all(feature = "redis", feature = "local"))]
type Fallback = Option<Arc<FallbackStore>>;

/// The fallback of `policies`, sized by `redis`'s fleet heartbeat (none when the provider
/// started without one: a reload added the fallback, so `size_when_unknown` applies).
#[cfg(all(feature = "redis", feature = "local"))]
fn fallback_store(
    policies: shared_contract::PolicySet,
    clock: Arc<dyn Clock>,
    local: adapter_local::LocalSettings,
    redis: &RedisProvider,
    size_when_unknown: u64,
) -> FallbackStore {
    let fleet = redis.fleet().map(|f| Arc::new(f) as Arc<dyn FleetSize>);
    FallbackStore::new(policies, clock, local, fleet, size_when_unknown)
}
/// Without the `local` feature there is no fallback (settings that ask for one are refused).
#[cfg(all(feature = "redis", not(feature = "local")))]
type Fallback = Option<Arc<std::convert::Infallible>>;

/// The redis provider's decorators, as [`stack`] built them.
#[cfg(feature = "redis")]
struct Layers {
    port: Arc<dyn EdgeRateLimitPort>,
    breaker: Option<Arc<CircuitBreaker>>,
}

/// The decorator stack over the redis provider, the one place its order is written, for
/// start-up and reload alike: `redis` inside the circuit breaker `breaker` makes of it (none
/// when it makes none: a new circuit at start-up, the running one's at a reload), inside the
/// local fallback over `fallback`'s store when there is one.
#[cfg(feature = "redis")]
fn stack(
    redis: Arc<RedisProvider>,
    breaker: impl FnOnce(Arc<dyn EdgeRateLimitPort>) -> Option<CircuitBreaker>,
    fallback: Fallback,
) -> Layers {
    let mut port: Arc<dyn EdgeRateLimitPort> = redis;
    let breaker = breaker(port.clone()).map(Arc::new);
    if let Some(b) = &breaker {
        port = b.clone();
    }
    #[cfg(feature = "local")]
    if let Some(store) = fallback {
        port = Arc::new(LocalFallback::new(port, store));
    }
    #[cfg(not(feature = "local"))]
    let _ = fallback;
    Layers { port, breaker }
}

/// Whether any policy (by its own failure policy or the global one) asks for the local
/// fallback; the decorator falls back only for the policies that do.
///
/// # Errors
/// [`BuildError::Unavailable`] when one does in a build without the `local` feature: such
/// settings are refused, not run fail-closed.
#[cfg(feature = "redis")]
fn needs_fallback(e: &EnabledSettings) -> Result<bool, BuildError> {
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
    Ok(fallback)
}
