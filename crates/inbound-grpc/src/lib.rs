//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`) over any
//! [`EdgeRateLimitPort`](shared_contract::EdgeRateLimitPort), so that gateways (Envoy, Istio)
//! can ask the same limits as the HTTP edge.
//!
//! The key design decision: **one `RateLimitRequest` is one all-or-nothing evaluation.** Every
//! descriptor that a rule ([`edge_middleware::descriptors`]) matches becomes one limit of a
//! single `evaluate_all`: the request is admitted only when every limit admits, and when any
//! denies nothing is charged anywhere. The evaluation goes through the HTTP edge's
//! [`edge_middleware::Limiter`]: subjects are digested with the application's subject key
//! before they reach the port, so raw descriptor values never reach Redis, logs or metrics,
//! and deadlines, shadow mode and the decision metrics are the HTTP edge's own. The crate depends on the contract, the edge and the gRPC stack
//! only (no provider, no configuration, no web framework).
//!
//! | module | what |
//! | --- | --- |
//! | [`service`] | `ShouldRateLimit`: checks, matching, the evaluation, the response; the failure mapping |
//! | [`server`] | the listener: the rate-limit method, the health service, the `[grpc]` limits, graceful shutdown |
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

#![warn(missing_docs)]

mod after;
pub mod server;
pub mod service;

pub use edge_middleware::descriptors::UnknownDescriptor;
pub use server::{
    Limits, MAX_HEADER_LIST_BYTES, MAX_MESSAGE_BYTES, Routes, SERVICE_NAME, ServeError, routes,
    routes_with, serve, serve_on, serve_with,
};
pub use service::{MAX_DESCRIPTORS, RlsService, TraceParent};
