//! Composition root of the rate-limiting toolkit: configuration -> validated settings -> the
//! chosen provider, wrapped in its decorators, plus the edge's subject hasher.
//!
//! The key design decision: **disabled means nothing exists.** [`RateLimitSettings`] is an
//! enum whose `Disabled` variant carries no settings, and [`compose::build`] returns `None`
//! for it: no connection, no task, no port; not a dummy provider that happens to allow.
//!
//! | module | what |
//! | --- | --- |
//! | [`config`] | figment (TOML + `APP_` env) and the validation pass that reports every problem with its key path; [`RateLimitSection`]: an embedding service's `[rate_limit]` table within its own file, with its own variable prefix |
//! | [`settings`] | the validated settings, and their redacted rendering for `--check` |
//! | `breaker` | the circuit breaker decorator around the redis provider (feature `redis`) |
//! | `fallback` | the `fallback_local` decorator (feature `local`) |
//! | [`compose`] | settings -> [`RateLimitRuntime`] |
//! | [`gates`] | `[event_gates.*]` -> [`GateRuntime`] (the gate provider and its publisher) |
//! | [`reload`] | which changes a running app takes on a configuration reload, and the revision rule |
//!
//! This is the only crate that names the adapters (`adapter-local`, `adapter-redis`). The
//! subject secret, hasher and source are the middleware's (`edge-middleware`), re-exported
//! here because configuration produces them; [`RateLimitRuntime::into_limiter`] hands the
//! composed port to the middleware.
//!
//! ## Features
//!
//! Each provider is a feature, so that an embedder compiles only the one it uses
//! (`default-features = false, features = ["local"]` reaches no Redis driver and no TLS).
//! Configuration is read the same in every build: a file that asks for a provider, or a
//! section of one, that the build lacks is refused at validation with its key path
//! (`rate_limit.provider: "redis" is not available: app-bootstrap was built without its
//! `redis` feature`).
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | `redis` | yes | the Redis provider and gates (`adapter-redis`), the circuit breaker around them, `[rate_limit.redis]` and `[rate_limit.circuit_breaker]` |
//! | `local` | yes | the local provider and gates (`adapter-local`), the `fallback_local` decorator, `[rate_limit.local]`; event gates are local unless rate limiting is enabled with the redis provider |
//!
//! With neither, the crate still builds (configuration, routes, the subject hasher) and
//! refuses every configuration that enables rate limiting or an event gate.

#![warn(missing_docs)]

#[cfg(feature = "redis")]
pub mod breaker;
pub mod compose;
pub mod config;
#[cfg(feature = "local")]
pub mod fallback;
mod features;
// The configuration's answers when a provider feature is left out, across `config`,
// `compose` and `gates`.
#[cfg(all(test, not(all(feature = "redis", feature = "local"))))]
mod feature_tests;
pub mod gates;
pub mod reload;
pub mod settings;
#[cfg(feature = "local")]
pub mod sightings;

#[cfg(feature = "redis")]
pub use breaker::{BreakerState, CircuitBreaker};
#[cfg(feature = "redis")]
pub use compose::build_on;
pub use compose::{BuildError, RateLimitRuntime, build};
pub use config::{ConfigErrors, Problem, RateLimitSection, Sources, from_toml, load};
pub use edge_middleware::{SecretError, SubjectHasher, SubjectSecret};
pub use gates::{GateRuntime, build_gates, rebuild_gates};
#[cfg(feature = "redis")]
pub use settings::BreakerSettings;
pub use settings::{
    CostSource, DescriptorRules, EnabledSettings, GrpcSettings, HeaderCondition, HttpSettings,
    LogFormat, LogSettings, OtlpSettings, ProviderSettings, RateLimitSettings, ReloadSettings,
    RouteSettings, Settings, SubjectSource, UnknownDescriptor,
};
