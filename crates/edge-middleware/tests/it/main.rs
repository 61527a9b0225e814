//! The integration tests of `edge-middleware`, one module per topic, in one test binary so
//! that a test build links the dependency tree once. One module: `cargo test -p
//! edge-middleware --test it route_layer::`.

mod concurrency_layer;
mod fuzz_headers;
mod mixed_failure;
mod ratelimit_fields;
mod route_layer;
mod source_metrics;
