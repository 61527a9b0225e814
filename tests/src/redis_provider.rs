//! The Redis provider on a private `redis-server`, set up the way the provider tests need
//! it: one policy that never refills or rolls over while a test runs, and settings with a
//! command timeout generous enough for a shared machine unless the test tunes it.

use std::time::Duration;

use adapter_redis::{RedisProvider, RedisSettings};
use shared_contract::{AlgorithmKind, RateLimitPolicy};

use crate::rate::{TestPolicy, policy_set};
use crate::redis_server::RedisServer;

const DAY: Duration = Duration::from_secs(86_400);

/// A policy of `kind` under `id` admitting `limit` at once and recovering over a day, so
/// nothing refills or rolls over while a test runs; clock regression up to 2 s is clamped.
pub fn daily_policy(id: &str, kind: AlgorithmKind, revision: u32, limit: u64) -> RateLimitPolicy {
    TestPolicy::of(id, kind, limit, DAY)
        .revision(revision)
        .max_clock_regression(Duration::from_secs(2))
        .build()
}

/// Settings for `server` with a command timeout of 2 s.
pub fn settings(server: &RedisServer) -> RedisSettings {
    let mut s = RedisSettings::new(server.url());
    s.command_timeout = Duration::from_secs(2);
    s
}

/// A provider of `policies` (the first one the default) on `settings`.
///
/// # Panics
/// When the settings are refused.
pub async fn connect(settings: RedisSettings, policies: Vec<RateLimitPolicy>) -> RedisProvider {
    RedisProvider::connect(settings, policy_set(policies))
        .await
        .expect("valid settings")
}

/// A private server and a provider of one [`daily_policy`] on it, with [`settings`] changed
/// by `tune` first.
#[derive(Debug)]
pub struct OnePolicy {
    pub server: RedisServer,
    pub policy: RateLimitPolicy,
    pub provider: RedisProvider,
}

impl OnePolicy {
    /// # Panics
    /// When the server does not start or the settings are refused.
    pub async fn start(
        id: &str,
        kind: AlgorithmKind,
        limit: u64,
        tune: impl FnOnce(&mut RedisSettings),
    ) -> Self {
        let server = RedisServer::start();
        let policy = daily_policy(id, kind, 1, limit);
        let mut s = settings(&server);
        tune(&mut s);
        let provider = connect(s, vec![policy.clone()]).await;
        Self {
            server,
            policy,
            provider,
        }
    }

    /// Runs `cmd` on the server.
    ///
    /// # Panics
    /// When the command fails.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        query(&self.server, cmd)
    }
}

/// Runs `cmd` on `server`.
///
/// # Panics
/// When the command fails.
pub fn query<T: redis::FromRedisValue>(server: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut server.connection())
        .expect("a Redis command")
}
