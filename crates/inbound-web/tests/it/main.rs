//! The end-to-end tests of `inbound-web`, one module per topic, in one test binary so that a
//! test build links the dependency tree once. One module: `cargo test -p inbound-web --test it
//! web_local::`.

mod common;
mod config_cli;
mod evaluate_list_local;
mod fuzz_bodies;
mod fuzz_stomp;
mod gates_conflicts;
mod gates_local;
mod gates_metrics;
mod gates_redis;
mod gates_slow;
mod hygiene_local;
mod leases_local;
mod leases_redis;
mod listener_limits;
mod log_json;
mod metrics_one_path;
mod openapi;
mod otlp_export;
mod prometheus_rules;
mod reload_local;
mod reload_redis;
mod reservations_local;
mod reservations_redis;
mod rls_interop;
mod routes_local;
mod shadow_local;
mod stream_bounds;
mod stream_idle;
mod stream_lossless;
mod web_fleet;
mod web_local;
mod web_redis;
