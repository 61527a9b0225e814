//! Starts a private redis-server per test group.
