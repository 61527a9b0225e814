//! Strategies shared by the model property tests.
