//! The one error type of this crate: what was wrong with the settings or policies handed to
//! [`crate::RedisProvider::connect`].
//!
//! Connection problems are deliberately *not* errors: an unreachable server at start is an
//! operational condition the provider reports as `Unavailable(connect)` (and through
//! `readiness()`) until the server answers, so a service can start before its Redis does.

use std::time::Duration;

/// Why a provider could not be built. Every message names the bad value and where it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A URL (`url`, `nodes[i]`, `sentinels[i]`) does not parse as a Redis URL. The URL itself
    /// is not echoed: it may hold a password.
    #[error("rate_limit.redis.{key}: not a valid Redis URL ({reason})")]
    InvalidUrl { key: String, reason: String },
    /// A URL names a transport this build does not speak (unix sockets, unknown schemes).
    #[error(
        "rate_limit.redis.{key}: scheme {scheme:?} is not supported by this build; use redis://host:port/db or rediss://host:port/db"
    )]
    UnsupportedScheme { key: String, scheme: String },
    /// The topology settings do not fit together (missing seed nodes or sentinels, mixed
    /// `redis://`/`rediss://`, a database other than 0 on a cluster, ...).
    #[error("rate_limit.redis.{key}: {reason}")]
    Topology { key: &'static str, reason: String },
    /// `min_replicas_ack` is beyond what a deployment can have.
    #[error(
        "rate_limit.redis.min_replicas_ack: must be at most {max}, got {got}",
        max = crate::RedisSettings::MAX_REPLICAS_ACK
    )]
    MinReplicasAck { got: u32 },
    /// `command_timeout` must be positive and at most [`crate::RedisSettings::MAX_COMMAND_TIMEOUT`].
    #[error("rate_limit.redis.command_timeout: must be between 1 ms and {max:?}, got {got:?}")]
    CommandTimeout { got: Duration, max: Duration },
    /// `connect_timeout` must be positive.
    #[error("rate_limit.redis.connect_timeout: must be > 0, got {got:?}")]
    ConnectTimeout { got: Duration },
    /// `max_in_flight` must be at least 1 (0 would refuse every request).
    #[error(
        "rate_limit.redis.max_in_flight: must be between 1 and {max}, got {got}",
        max = crate::RedisSettings::MAX_IN_FLIGHT
    )]
    MaxInFlight { got: usize },
    /// `connections` must be between 1 and [`crate::RedisSettings::MAX_CONNECTIONS`].
    #[error(
        "rate_limit.redis.connections: must be between 1 and {max}, got {got}",
        max = crate::RedisSettings::MAX_CONNECTIONS
    )]
    Connections { got: usize },
    /// `key_prefix` must be 1..=32 characters of `[A-Za-z0-9_.-]` (no `{`/`}`: they would change
    /// the cluster hash tag; no `:`: it separates the prefix from the rest).
    #[error(
        "rate_limit.redis.key_prefix: must be 1..=32 characters of [A-Za-z0-9_.-], got {got:?}"
    )]
    KeyPrefix { got: String },
    /// A TLS setting is missing or its file cannot be used (the key is under `rate_limit.redis`).
    #[error("rate_limit.redis.{key}: {reason}")]
    Tls { key: &'static str, reason: String },
    /// `username`/`password` cannot be combined with the URL's own credentials, or are empty.
    #[error("rate_limit.redis.{key}: {reason}")]
    Credentials { key: &'static str, reason: String },
    /// A gate provider tunable is out of range (`RedisGateSettings`).
    #[error("event_gates.redis.{field}: out of range, got {got}")]
    GateSetting { field: &'static str, got: String },
}
