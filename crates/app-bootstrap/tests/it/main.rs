//! The integration tests of `app-bootstrap`, one module per topic, in one test binary like
//! every package's (tests/README.md). One module: `cargo test -p app-bootstrap --test it
//! fuzz_config::`.

mod fuzz_config;
