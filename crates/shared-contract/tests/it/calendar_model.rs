//! Calendar quota periods in the fixed-window model, with explicit clock readings: a month
//! window across a month boundary and across a DST change, a day of 23 hours, the quota of a
//! new period, and the state's lifetime.

use shared_contract::model::{self, AlgorithmState, Verdict};
use shared_contract::policy::calendar::CalendarUnit;
use shared_contract::{Cost, RateLimitPolicy};

const HOUR: u64 = 3_600_000;

/// Unix ms of an RFC 3339 instant (UTC).
fn at(text: &str) -> u64 {
    let t: jiff::Timestamp = text.parse().expect("an instant");
    u64::try_from(t.as_millisecond()).expect("after 1970")
}

fn policy(unit: CalendarUnit, zone: &str, limit: u64) -> RateLimitPolicy {
    RateLimitPolicy::calendar("quota", limit, unit)
        .time_zone(zone)
        .max_cost(limit)
        .build()
        .expect("valid")
}

/// Evaluates `cost` at `now`, keeping state as a provider would.
fn step(
    p: &RateLimitPolicy,
    state: &mut Option<AlgorithmState>,
    now: u64,
    cost: u64,
) -> model::Evaluation<AlgorithmState> {
    let cost = Cost::new(cost).expect("positive");
    let e = model::evaluate(p, state.as_ref(), now, cost).expect("in range");
    if let Some(s) = e.new_state.clone() {
        *state = Some(s);
    }
    e
}

#[test]
fn a_month_quota_renews_at_the_zones_first_of_the_month() {
    let p = policy(CalendarUnit::Month, "Europe/Berlin", 1_000);
    let mut s = None;
    // 31 March, 23:00 in Berlin (summer time since the 29th, +02:00).
    let late = at("2026-03-31T21:00:00Z");
    let e = step(&p, &mut s, late, 1_000);
    assert_eq!(e.verdict, Verdict::Allowed);
    assert_eq!(
        e.reset_at_ms,
        at("2026-03-31T22:00:00Z"),
        "April starts at 00:00 +02:00"
    );
    let e = step(&p, &mut s, late + 30 * 60_000, 1);
    assert_eq!(
        (e.verdict, e.retry_after_ms),
        (Verdict::Denied, 30 * 60_000)
    );
    // The month began on 1 March at 00:00 +01:00: 23:00 UTC on 28 February, in winter time.
    let e = step(&p, &mut s, at("2026-03-31T22:00:00Z"), 1);
    assert_eq!((e.verdict, e.remaining), (Verdict::Allowed, 999));
    assert_eq!(e.reset_at_ms, at("2026-04-30T22:00:00Z"));
}

#[test]
fn a_month_spanning_a_dst_change_is_one_quota() {
    let p = policy(CalendarUnit::Month, "Europe/Berlin", 10);
    let mut s = None;
    // Before and after the change on 29 March 2026: the same month, one quota.
    assert_eq!(
        step(&p, &mut s, at("2026-03-01T00:00:00Z"), 6).verdict,
        Verdict::Allowed
    );
    let e = step(&p, &mut s, at("2026-03-30T12:00:00Z"), 5);
    assert_eq!((e.verdict, e.remaining), (Verdict::Denied, 4));
    // The window opened at 23:00 UTC on 28 February (00:00 +01:00), so a request just before
    // it belongs to February's quota.
    let mut other = None;
    let feb = step(&p, &mut other, at("2026-02-28T22:59:59.999Z"), 10);
    assert_eq!(feb.reset_at_ms, at("2026-02-28T23:00:00Z"));
    let march = step(&p, &mut other, at("2026-02-28T23:00:00Z"), 10);
    assert_eq!(march.verdict, Verdict::Allowed);
}

#[test]
fn a_dst_day_has_23_hours_and_one_days_quota() {
    let p = policy(CalendarUnit::Day, "Europe/Berlin", 5);
    let mut s = None;
    let e = step(&p, &mut s, at("2026-03-29T12:00:00Z"), 5);
    assert_eq!(e.reset_at_ms, at("2026-03-29T22:00:00Z"));
    let start = at("2026-03-28T23:00:00Z");
    assert_eq!(e.reset_at_ms - start, 23 * HOUR);
    // The state lives until the period ends (plus grace): never past the longest day.
    assert!(e.ttl_ms <= CalendarUnit::Day.longest_ms() + p.cleanup_grace_ms());
}

#[test]
fn the_reset_horizon_is_the_longest_period() {
    for unit in CalendarUnit::ALL {
        let p = policy(unit, "UTC", 1);
        assert_eq!(
            p.algorithm().reset_horizon_ms(),
            unit.longest_ms(),
            "{unit}"
        );
    }
}
