//! The conformance suite on the local provider: with a manual clock (exact time), as the
//! fallback stand-in, and on the real system clock (the way the Redis target runs, so the
//! suite's real-time paths are exercised here too).

use std::sync::Arc;

use acceptance_tests::conformance::Target;
use adapter_local::{LocalProvider, LocalSettings};
use shared_contract::{Clock, EdgeRateLimitPort, ManualClock, PolicySet, Source, SystemClock};

/// A fixed start (2025-12-02T10:40:00.123Z), so failures replay at the same times.
const START_MS: u64 = 1_764_672_000_123;

/// Local providers on one manual clock.
#[derive(Debug)]
struct LocalTarget {
    clock: ManualClock,
    fallback: bool,
}

impl LocalTarget {
    fn new() -> Self {
        Self {
            clock: ManualClock::new(START_MS),
            fallback: false,
        }
    }

    fn fallback() -> Self {
        Self {
            fallback: true,
            ..Self::new()
        }
    }
}

#[async_trait::async_trait]
impl Target for LocalTarget {
    async fn provider(&self, policies: PolicySet) -> Arc<dyn EdgeRateLimitPort> {
        let clock = Arc::new(self.clock.clone());
        let settings = LocalSettings::default();
        if self.fallback {
            Arc::new(LocalProvider::fallback(policies, clock, settings))
        } else {
            Arc::new(LocalProvider::new(policies, clock, settings))
        }
    }

    async fn advance(&self, ms: u64) {
        self.clock.advance(ms);
    }

    async fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn exact_time(&self) -> bool {
        true
    }

    fn source(&self) -> Source {
        if self.fallback {
            Source::LocalFallback
        } else {
            Source::Local
        }
    }
}

/// Local providers on the system clock: time passes only by sleeping.
#[derive(Debug)]
struct RealTimeLocalTarget;

#[async_trait::async_trait]
impl Target for RealTimeLocalTarget {
    async fn provider(&self, policies: PolicySet) -> Arc<dyn EdgeRateLimitPort> {
        Arc::new(LocalProvider::new(
            policies,
            Arc::new(SystemClock),
            LocalSettings::default(),
        ))
    }

    async fn advance(&self, ms: u64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }

    async fn now_ms(&self) -> u64 {
        SystemClock.now_ms()
    }

    fn exact_time(&self) -> bool {
        false
    }

    fn source(&self) -> Source {
        Source::Local
    }
}

mod local {
    use super::*;
    acceptance_tests::conformance_tests!(LocalTarget::new());
}

mod local_fallback {
    use super::*;
    acceptance_tests::conformance_tests!(LocalTarget::fallback());
}

mod local_real_time {
    use super::*;
    acceptance_tests::conformance_tests!(RealTimeLocalTarget);
}

mod local_leases {
    use super::*;
    acceptance_tests::lease_conformance_tests!(LocalTarget::new());
}

mod local_real_time_leases {
    use super::*;
    acceptance_tests::lease_conformance_tests!(RealTimeLocalTarget);
}

mod local_reservations {
    use super::*;
    acceptance_tests::reservation_conformance_tests!(LocalTarget::new());
}

mod local_real_time_reservations {
    use super::*;
    acceptance_tests::reservation_conformance_tests!(RealTimeLocalTarget);
}

mod local_charges {
    use super::*;
    acceptance_tests::charge_conformance_tests!(LocalTarget::new());
}

mod local_real_time_charges {
    use super::*;
    acceptance_tests::charge_conformance_tests!(RealTimeLocalTarget);
}
