//! Rate limiting at the HTTP edge: a tower middleware, and the one evaluation behind it, over
//! any [`EdgeRateLimitPort`](shared_contract::EdgeRateLimitPort).
//!
//! The key design decision: **the edge speaks HTTP, the port speaks outcomes.** This crate
//! turns requests into `RateLimitRequest`s (subject extracted and HMAC-digested once, here)
//! and outcomes into HTTP (200/429/503, draft-11 `RateLimit` headers, problem+json), and never
//! knows which provider answered: it holds an `Arc<dyn EdgeRateLimitPort>` that the
//! application composed. It depends on the contract and on small HTTP, hashing and telemetry
//! crates only (`http`, `tower-layer`/`tower-service`, `hmac`/`sha2`, `metrics`, `tracing`,
//! `serde_json` for problem bodies): no provider, no configuration, no async runtime and no
//! web framework, so a service that wants the middleware over the local provider compiles
//! neither Redis, TLS nor the configuration layer. (The dev-dependencies, axum, tokio and
//! `adapter-local`, serve the tests and the example below only.)
//!
//! | module | what |
//! | --- | --- |
//! | [`descriptors`] | gateway rate-limit descriptors (Envoy's `RateLimitService`) -> policy and subject |
//! | [`failure`] | the one rule for a multi-limit evaluation the provider could not decide: which policy's failure policy applies and is named |
//! | [`limiter`] | one evaluation: digest, deadline, port, metrics, tracing span |
//! | [`split`] | the shadow split every entry point uses: the enforced limits as one evaluation, then the shadow ones when the request goes through |
//! | [`leases`] | concurrency leases: the limiter's acquire and release, with metrics |
//! | [`concurrency`] | `ConcurrencyLayer` / `Concurrency<S>`: a lease held per request while its response body is sent |
//! | [`reservations`] | costs known after the work: the limiter's reserve, settle and cancel, with metrics |
//! | [`metered`] | `MeteredLayer` / `Metered<S>`: an estimate reserved per request, settled with the actual cost the response reports (a trailer of a streamed body, or a header), exactly once |
//! | [`layer`] | `RateLimitLayer` / `RateLimit<S>`: the tower middleware; the limits of one request are one all-or-nothing evaluation |
//! | [`rule`] | which requests a policy limits (path, methods, host, headers), the subject parts, the cost |
//! | [`headers`] | draft-ietf-httpapi-ratelimit-headers-11 `RateLimit-Policy` / `RateLimit` |
//! | [`problem`] | RFC 9457 problem+json bodies (429 quota-exceeded, 503, 400) |
//! | [`subject`] | where the subject is read, its HMAC-SHA256 secret and hasher |
//!
//! ## Mounting the middleware
//!
//! An axum app limited to 2 requests per minute per API key, on the in-memory provider built
//! in code:
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use adapter_local::{LocalProvider, LocalSettings};
//! use axum::body::Body;
//! use axum::extract::ConnectInfo;
//! use axum::http::{Request, StatusCode};
//! use edge_middleware::{
//!     Limiter, RateLimitLayer, Rule, SubjectHasher, SubjectSecret, SubjectSource,
//! };
//! use shared_contract::{FailurePolicy, PolicyId, PolicySet, RateLimitPolicy, SystemClock};
//! use tower::ServiceExt as _;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let id = PolicyId::new("api")?;
//! let policy = RateLimitPolicy::fixed_window("api", 2).per(Duration::from_secs(60)).build()?;
//! let policies = PolicySet::new([policy], id.clone())?;
//! let port = LocalProvider::new(policies, Arc::new(SystemClock), LocalSettings::default());
//! let limiter = Limiter::new(
//!     Arc::new(port),
//!     // A fixed secret (32 bytes or more) when several instances must agree on digests.
//!     SubjectHasher::new(&SubjectSecret::random()),
//!     FailurePolicy::FailClosed,
//!     Duration::from_millis(100),
//! );
//! let rules = vec![Rule::new("/api", id, SubjectSource::Header("x-api-key".into()))];
//! let layer = RateLimitLayer::new(Arc::new(limiter), rules)
//!     // Only `ip` rules need it: where this server keeps the peer address.
//!     .with_peer_ip(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
//! let app = axum::Router::new()
//!     .route("/api/hello", axum::routing::get(|| async { "hello" }))
//!     .layer(layer);
//!
//! let request = || Request::get("/api/hello").header("x-api-key", "k1").body(Body::empty());
//! assert_eq!(app.clone().oneshot(request()?).await?.status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(request()?).await?.status(), StatusCode::OK);
//! let denied = app.oneshot(request()?).await?;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["ratelimit-policy"], "\"api\";q=2;w=60");
//! // To serve it: axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # Ok(())
//! # }
//! ```
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

#![warn(missing_docs)]

pub mod concurrency;
pub mod descriptors;
pub mod failure;
pub mod headers;
pub mod layer;
pub mod leases;
pub mod limiter;
pub mod metered;
pub mod problem;
pub mod reservations;
pub mod rule;
pub mod split;
pub mod subject;

pub use concurrency::{Concurrency, ConcurrencyLayer, LeaseBody};
pub use layer::{RateLimit, RateLimitLayer, UnknownPolicy};
pub use limiter::{BreakerGauge, Limiter, LimiterBuilder, Member, PolicyIndex};
pub use metered::{Metered, MeteredBody, MeteredLayer, MeteredRule};
pub use rule::{CostSource, HeaderCondition, PeerIp, Rule, most_overlapping, parse_method};
pub use split::Split;
pub use subject::{
    MAX_CONST_BYTES, MAX_SUBJECT_BYTES, SecretError, SubjectHasher, SubjectSecret, SubjectSource,
};
