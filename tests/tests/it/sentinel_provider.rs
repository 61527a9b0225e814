//! The Redis provider on a real Sentinel topology (master, replica, three sentinels started by
//! the harness): the conformance suite for every algorithm, with the master resolved through
//! the sentinels. Failover under load is in `fault_failover.rs`.

use std::sync::OnceLock;

use acceptance_tests::redis_target::RedisTarget;
use acceptance_tests::sentinel::RedisSentinel;
use adapter_redis::{RedisProvider, RedisSettings};
use shared_contract::{EdgeRateLimitPort, Readiness};

/// One topology for this binary (killed when the binary exits).
fn topology() -> &'static RedisSentinel {
    static TOPOLOGY: OnceLock<RedisSentinel> = OnceLock::new();
    TOPOLOGY.get_or_init(RedisSentinel::start)
}

fn settings() -> RedisSettings {
    let t = topology();
    RedisSettings::sentinel(t.master_name(), t.sentinel_urls())
}

mod sentinel_conformance {
    use super::*;
    acceptance_tests::conformance_tests!(RedisTarget::new(settings));
}

mod sentinel_lease_conformance {
    use super::*;
    acceptance_tests::lease_conformance_tests!(RedisTarget::new(settings));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_found_through_the_sentinels_and_an_unknown_name_is_never_ready() {
    let policies = acceptance_tests::rate::policy_set(vec![acceptance_tests::conformance::policy(
        shared_contract::AlgorithmKind::TokenBucket,
        1,
        10,
        60_000,
        1,
    )]);
    let p = RedisProvider::connect(settings(), policies.clone())
        .await
        .expect("valid settings");
    assert_eq!(p.readiness().await, Readiness::Ready);
    // Sentinels that do not monitor the name: never ready, and the reason says so.
    let wrong = RedisSettings::sentinel("no-such-master", topology().sentinel_urls());
    let p = RedisProvider::connect(wrong, policies)
        .await
        .expect("valid settings");
    match p.readiness().await {
        Readiness::NotReady(why) => {
            assert!(why.contains("does not monitor"), "{why}");
            assert!(why.contains("no-such-master"), "{why}");
        }
        Readiness::Ready => panic!("an unknown master name must not be ready"),
    }
}

mod sentinel_charges {
    use super::*;
    acceptance_tests::charge_conformance_tests!(RedisTarget::new(settings));
}

mod sentinel_reservations {
    use super::*;
    acceptance_tests::reservation_conformance_tests!(RedisTarget::new(settings));
}
