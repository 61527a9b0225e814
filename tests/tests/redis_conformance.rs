//! The conformance suite on the Redis provider, for every algorithm, against the test
//! binary's private `redis-server` (or `REDIS_URL`).
//!
//! Redis time is the server's `TIME`, so the target's time moves only by really sleeping
//! (`exact_time() == false`): the suite then checks everything that holds on a real clock.

use std::sync::Arc;
use std::time::Duration;

use acceptance_tests::conformance::Target;
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{RedisProvider, RedisSettings};
use shared_contract::{Clock, EdgeRateLimitPort, PolicySet, Source, SystemClock};

/// Redis providers on the shared test server. Each call connects a new provider (its own
/// connection), as separate service instances would.
#[derive(Debug)]
struct RedisTarget;

#[async_trait::async_trait]
impl Target for RedisTarget {
    async fn provider(&self, policies: PolicySet) -> Arc<dyn EdgeRateLimitPort> {
        let mut settings = RedisSettings::new(RedisServer::shared().url());
        // The suite runs many cases in parallel on two shared cores: a generous timeout keeps
        // a slow scheduler from turning a decision into `Indeterminate`.
        settings.command_timeout = Duration::from_secs(2);
        Arc::new(
            RedisProvider::connect(settings, policies)
                .await
                .expect("valid Redis settings"),
        )
    }

    async fn advance(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    async fn now_ms(&self) -> u64 {
        // The server runs on this host, so its `TIME` is the host clock.
        SystemClock.now_ms()
    }

    fn exact_time(&self) -> bool {
        false
    }

    fn source(&self) -> Source {
        Source::GlobalRedis
    }
}

mod redis {
    use super::*;
    acceptance_tests::conformance_tests!(RedisTarget);
}
