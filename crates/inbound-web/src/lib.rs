//! The axum reference app of the rate-limiting toolkit: the `inbound-web` binary, built on the
//! `edge-middleware` library and composed by `app-bootstrap`.
//!
//! The key design decision: **the app composes, the library limits.** Everything that turns
//! a request into an evaluation and an outcome into HTTP (the tower middleware, the limiter,
//! the headers, problem+json) lives in `edge-middleware`, which any service can mount without
//! this crate; this crate adds the routes, the event gates and the server, and gets its
//! `Arc<dyn EdgeRateLimitPort>` from `app-bootstrap`. It never depends on an adapter.
//!
//! | module | what |
//! | --- | --- |
//! | [`api`] | the handlers of `POST /v1/evaluate`, `GET /v1/config`, `/healthz`, `/readyz`, `/metrics` |
//! | [`state`] | `ApiState`, what the handlers share, and the check of one evaluation's policy, subject and cost |
//! | `response` | how the API answers: JSON, decision bodies, outcomes that are not decisions, refused requests |
//! | [`leases`] | `POST /v1/leases`, `DELETE /v1/leases/{lease_id}`: concurrency leases |
//! | `body` | request bodies are JSON objects: one reader that refuses arrays for every body |
//! | [`reservations`] | `POST /v1/reservations`, `.../{id}/settle`, `DELETE /v1/reservations/{id}`: costs settled after the work |
//! | [`evaluate_list`] | the list form of `/v1/evaluate`: several limits as one, all-or-nothing |
//! | [`gates`] | the event-gate routes: submit, event, snapshot; under it the WebSocket `stream` (snapshot plus deltas, slow subscribers closed), its `subscribers` bounds and the gate `metrics` |
//! | [`app`] | the reference app's router (the middleware over the demo upstream) and server |
//! | [`openapi`] | `GET /openapi.json`: the OpenAPI 3.1 document of every route, checked against the router by a test |
//! | [`reload`] | configuration reload on `SIGHUP` and file change |
//! | [`config_view`] | what `GET /v1/config` shows: the configuration in force and the last refused reload |
//! | [`hygiene`] | the outermost layer: request-head bounds, the body limit and timeout on every route, framework errors as problem+json |
//! | [`telemetry`] | `[otlp]`: OpenTelemetry trace export, the server span, the caller's `traceparent` |
//!
//! ## Features
//!
//! | feature | default | what |
//! | --- | --- | --- |
//! | (none) | | this crate has no optional features |

#![warn(missing_docs)]

pub mod api;
pub mod app;
mod body;
pub mod config_view;
pub mod evaluate_list;
pub mod gates;
pub mod hygiene;
pub mod leases;
pub mod listener;
pub mod openapi;
pub mod reload;
pub mod reservations;
mod response;
pub mod state;
pub mod telemetry;

// The middleware's names, where this crate exported them before it moved to its own crate.
pub use edge_middleware::{Limiter, RateLimit, RateLimitLayer, Rule};
