//! The conformance suite's [`Target`] for the Redis provider on any topology: each call
//! connects a new provider (its own connections, as a separate service instance would) from
//! settings the test file gives.
//!
//! Redis time is the servers' `TIME`, so the target's time moves only by really sleeping
//! (`exact_time() == false`): the suite then checks everything that holds on a real clock.

use std::sync::Arc;
use std::time::Duration;

use adapter_redis::{RedisProvider, RedisSettings, Topology};
use shared_contract::{Clock, EdgeRateLimitPort, PolicySet, Source, SystemClock};

use crate::conformance::Target;

/// Redis providers built from `settings()`.
#[derive(Debug)]
pub struct RedisTarget {
    settings: fn() -> RedisSettings,
}

impl RedisTarget {
    /// A target whose providers use `settings()` with a command timeout of 2 s: the suite
    /// runs many cases in parallel on two shared cores, and a slow scheduler must not turn a
    /// decision into `Indeterminate`.
    pub fn new(settings: fn() -> RedisSettings) -> Self {
        Self { settings }
    }
}

#[async_trait::async_trait]
impl Target for RedisTarget {
    async fn provider(&self, policies: PolicySet) -> Arc<dyn EdgeRateLimitPort> {
        let mut settings = (self.settings)();
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
        // The servers run on this host, so their `TIME` is the host clock.
        SystemClock.now_ms()
    }

    fn exact_time(&self) -> bool {
        false
    }

    fn source(&self) -> Source {
        Source::GlobalRedis
    }

    fn one_slot_per_call(&self) -> bool {
        matches!((self.settings)().topology, Topology::Cluster { .. })
    }
}
