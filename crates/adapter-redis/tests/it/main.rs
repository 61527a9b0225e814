//! The integration tests of `adapter-redis` (fuzzing the reply parsers, the deny cache's
//! allocations), one module per topic, in one test binary so that a test build links the
//! dependency tree once. One module: `cargo test -p adapter-redis --test it fuzz_resp::`.

mod deny_cache_alloc;
mod fuzz_replies;
mod fuzz_resp;
mod fuzz_resp_memory;
