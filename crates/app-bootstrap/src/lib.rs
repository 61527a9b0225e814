//! Composition root of the rate-limiting toolkit: configuration -> validated settings -> the
//! chosen provider, wrapped in its decorators, plus the edge's subject hasher.
//!
//! The key design decision: **disabled means nothing exists.** [`RateLimitSettings`] is an
//! enum whose `Disabled` variant carries no settings, and [`compose::build`] returns `None`
//! for it: no connection, no task, no port; not a dummy provider that happens to allow.
//!
//! | module | what |
//! | --- | --- |
//! | [`config`] | figment (TOML + `APP_` env) and the validation pass that reports every problem with its key path |
//! | [`settings`] | the validated settings, and their redacted rendering for `--check` |
//! | [`breaker`] | the circuit breaker decorator around the redis provider |
//! | [`fallback`] | the `fallback_local` decorator |
//! | [`compose`] | settings -> [`RateLimitRuntime`] |
//! | [`gates`] | `[event_gates.*]` -> [`GateRuntime`] (the gate provider and its publisher) |
//!
//! This is the only crate that names the adapters (`adapter-local`, `adapter-redis`). The
//! subject secret, hasher and source are the middleware's (`edge-middleware`), re-exported
//! here because configuration produces them; [`RateLimitRuntime::into_limiter`] hands the
//! composed port to the middleware.
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

pub mod breaker;
pub mod compose;
pub mod config;
pub mod fallback;
pub mod gates;
pub mod settings;

pub use breaker::{BreakerState, CircuitBreaker};
pub use compose::{BuildError, RateLimitRuntime, build};
pub use config::{ConfigErrors, Problem, Sources, from_toml, load};
pub use edge_middleware::{SecretError, SubjectHasher, SubjectSecret};
pub use gates::{GateRuntime, build_gates};
pub use settings::{
    BreakerSettings, CostSource, DescriptorRules, EnabledSettings, GrpcSettings, HeaderCondition,
    HttpSettings, LogFormat, LogSettings, OtlpSettings, ProviderSettings, RateLimitSettings,
    RouteSettings, Settings, SubjectSource, UnknownDescriptor,
};
