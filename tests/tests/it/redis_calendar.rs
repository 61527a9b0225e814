//! Calendar quota periods on the Redis provider: a month of Europe/Berlin counted until its
//! end on Redis's clock, through every path (one limit, several, a reservation, a charge);
//! the previous period's count not counted; two instances admitting exactly the limit. The
//! programs' windows against the model, bounds off the caller's clock included, are
//! `lua_differential.rs`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use acceptance_tests::conformance_leases::deadline;
use acceptance_tests::lua::encode_state;
use acceptance_tests::rate::{allowed, request, subject};
use acceptance_tests::redis_provider::{connect, query, settings};
use acceptance_tests::redis_server::RedisServer;
use shared_contract::model::{AlgorithmState, FixedWindowState};
use shared_contract::multi::{Limit, Limits};
use shared_contract::policy::calendar::{Calendar, CalendarUnit};
use shared_contract::reservation::ReservationTtl;
use shared_contract::{
    ChargeLimit, ChargeRequest, Cost, EdgeRateLimitPort, MultiRequest, Outcome, RateLimitDecision,
    RateLimitOutcome, RateLimitPolicy, ReserveRequest, Reserved, SettleRequest,
};

/// The decision of a request of `cost`.
async fn decide(
    port: &dyn EdgeRateLimitPort,
    p: &RateLimitPolicy,
    s: shared_contract::SubjectDigest,
    cost: u64,
) -> RateLimitDecision {
    match port.evaluate(request(p, s, cost)).await.expect("valid") {
        RateLimitOutcome::Evaluated(d) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn month(limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::calendar("monthly", limit, CalendarUnit::Month)
        .time_zone("Europe/Berlin")
        .max_cost(limit)
        .build()
        .expect("valid")
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("in range")
}

/// This month of Europe/Berlin, by this machine's clock.
fn this_month() -> (u64, u64) {
    let c = Calendar::new(CalendarUnit::Month, "Europe/Berlin").expect("a zone");
    c.bounds(now_ms()).expect("in range")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_month_is_counted_on_redis_until_it_ends() {
    let server = RedisServer::start();
    let p = month(3);
    let provider = connect(settings(&server), vec![p.clone()]).await;
    let s = subject(1);
    let (start, end) = this_month();
    for left in [2, 1, 0] {
        let d = decide(&provider, &p, s, 1).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
        assert_eq!(d.reset_at_ms, end, "the month ends at its calendar end");
    }
    let denied = decide(&provider, &p, s, 1).await;
    assert!(!denied.allowed);
    assert_eq!(denied.reset_at_ms, end);
    let left = end - now_ms();
    assert!(
        denied.retry_after_ms.abs_diff(left) <= 60_000,
        "retry until the month ends: {} vs {left}",
        denied.retry_after_ms
    );
    assert!(start < end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_months_count_is_not_counted() {
    let server = RedisServer::start();
    let p = month(5);
    let provider = connect(settings(&server), vec![p.clone()]).await;
    let s = subject(2);
    let (start, _) = this_month();
    // Full and overdrawn in the last hour of the previous month.
    let state = AlgorithmState::FixedWindow(FixedWindowState {
        last_ms: start - 3_600_000,
        count: 5,
        overdraft: 7,
    });
    let key = provider.state_key(p.id(), &s).expect("a key");
    let bytes = encode_state(p.revision().get(), &state).expect("encodable");
    let _: () = query(&server, redis::cmd("SET").arg(&key).arg(bytes));
    let d = decide(&provider, &p, s, 2).await;
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 3),
        "a new month starts empty"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_reservations_and_charges_count_the_month() {
    let server = RedisServer::start();
    let p = month(10);
    let daily = acceptance_tests::redis_provider::daily_policy(
        "daily",
        shared_contract::AlgorithmKind::TokenBucket,
        1,
        100,
    );
    let provider = connect(settings(&server), vec![p.clone(), daily.clone()]).await;
    let s = subject(3);
    let limit = |policy: &RateLimitPolicy, cost| Limit {
        policy_id: policy.id().clone(),
        subject: s,
        cost: Cost::new(cost).expect("a cost"),
    };
    let both = MultiRequest {
        limits: Limits::new(vec![limit(&p, 2), limit(&daily, 1)]).expect("valid"),
        evaluation_id: None,
        deadline: deadline(),
    };
    let Outcome::Evaluated(d) = provider.evaluate_all(both).await.expect("valid") else {
        panic!("a decision");
    };
    assert!(d.allowed);
    assert_eq!(d.decisions[0].remaining, 8);
    let reserved = provider
        .reserve(ReserveRequest {
            limits: Limits::new(vec![limit(&p, 5)]).expect("valid"),
            ttl: ReservationTtl::from_millis(60_000).expect("a ttl"),
            deadline: deadline(),
        })
        .await
        .expect("valid");
    let Outcome::Evaluated(Reserved {
        id: Some(id),
        decision,
        ..
    }) = reserved
    else {
        panic!("a reservation: {reserved:?}");
    };
    assert_eq!(decision.decisions[0].remaining, 3);
    let settled = provider
        .settle(SettleRequest {
            id,
            actual: vec![1],
            deadline: deadline(),
        })
        .await
        .expect("valid");
    let Outcome::Evaluated(Ok(settled)) = settled else {
        panic!("a settlement: {settled:?}");
    };
    assert_eq!(
        settled.decisions[0].remaining, 7,
        "4 of the 5 came back this month"
    );
    let charged = provider
        .charge(ChargeRequest {
            limits: vec![ChargeLimit {
                policy_id: p.id().clone(),
                subject: s,
                cost: 9,
            }],
            deadline: deadline(),
        })
        .await
        .expect("valid");
    let Outcome::Evaluated(charged) = charged else {
        panic!("a charge: {charged:?}");
    };
    assert_eq!(
        charged.decisions[0].remaining, 0,
        "2 past the limit, owed until the month ends"
    );
    let denied = decide(&provider, &p, s, 1).await;
    assert!(!denied.allowed);
    assert_eq!(denied.reset_at_ms, this_month().1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_months_limit() {
    let server = RedisServer::start();
    let p = month(50);
    let a = Arc::new(connect(settings(&server), vec![p.clone()]).await);
    let b = Arc::new(connect(settings(&server), vec![p.clone()]).await);
    let s = subject(4);
    let mut tasks = Vec::new();
    for i in 0..120 {
        let port = if i % 2 == 0 { a.clone() } else { b.clone() };
        let p = p.clone();
        tasks.push(tokio::spawn(async move { allowed(&*port, &p, s).await }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u32::from(t.await.expect("no panic"));
    }
    assert_eq!(admitted, 50);
}
