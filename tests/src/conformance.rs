//! The conformance suite, written once and run on every provider.
