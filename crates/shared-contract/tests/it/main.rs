//! The reference models' properties and worked examples, one module per topic, in one test
//! binary so that a test build links the dependency tree once. One module: `cargo test -p
//! shared-contract --test it gate_model::`.

mod calendar_model;
mod common;
mod concurrency_model;
mod denial_properties;
mod fleet_share_properties;
mod gate_model;
mod gate_model_properties;
mod model_properties;
mod multi_model_properties;
mod reservation_properties;
