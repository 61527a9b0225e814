//! The axum reference app of the rate-limiting toolkit, and a tower middleware any axum app
//! can mount.
//!
//! The key design decision: **the edge speaks HTTP, the port speaks outcomes.** This crate
//! turns requests into `RateLimitRequest`s (subject extracted and HMAC-digested once, here)
//! and outcomes into HTTP (200/429/503, draft-11 `RateLimit` headers, problem+json), and
//! never knows which provider answered: it holds an `Arc<dyn EdgeRateLimitPort>` composed by
//! `app-bootstrap`. It never depends on an adapter.
//!
//! | module | what |
//! | --- | --- |
//! | [`limiter`] | one evaluation: digest, deadline, port, metrics, tracing span |
//! | [`layer`] | `RateLimitLayer` / `RateLimit<S>`: the tower middleware |
//! | [`headers`] | draft-ietf-httpapi-ratelimit-headers-11 `RateLimit-Policy` / `RateLimit` |
//! | [`problem`] | RFC 9457 problem+json bodies (429 quota-exceeded, 503, 400) |
//! | [`api`] | `POST /v1/evaluate`, `/healthz`, `/readyz`, `/metrics` |
//! | [`gates`] | the event-gate routes: submit, event, snapshot |
//! | [`stream`] | the gate WebSocket stream: snapshot plus deltas, slow subscribers closed |
//! | [`app`] | the reference app's router and server |
//!
//! ## Mounting the middleware
//!
//! ```text
//! let limiter = Arc::new(Limiter::new(runtime)); // runtime from app_bootstrap::build
//! let layer = RateLimitLayer::new(limiter, vec![Rule::new("/api", policy_id, SubjectSource::Ip)]);
//! let app = axum::Router::new().route("/api/x", get(handler)).layer(layer);
//! ```
//! (Serve with `into_make_service_with_connect_info::<SocketAddr>()` for `ip` subjects.)
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

pub mod api;
pub mod app;
pub mod gates;
pub mod headers;
pub mod layer;
pub mod limiter;
pub mod problem;
pub mod stream;

pub use layer::{RateLimit, RateLimitLayer, Rule};
pub use limiter::Limiter;
