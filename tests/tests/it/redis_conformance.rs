//! The conformance suite on the Redis provider, for every algorithm, against the test
//! binary's private `redis-server` (or `REDIS_URL`).

use acceptance_tests::redis_server::RedisServer;
use acceptance_tests::redis_target::RedisTarget;
use adapter_redis::RedisSettings;

fn settings() -> RedisSettings {
    RedisSettings::new(RedisServer::shared().url())
}

mod redis {
    use super::*;
    acceptance_tests::conformance_tests!(RedisTarget::new(settings));
}

mod redis_leases {
    use super::*;
    acceptance_tests::lease_conformance_tests!(RedisTarget::new(settings));
}

mod redis_charges {
    use super::*;
    acceptance_tests::charge_conformance_tests!(RedisTarget::new(settings));
}

mod redis_reservations {
    use super::*;
    acceptance_tests::reservation_conformance_tests!(RedisTarget::new(settings));
}
