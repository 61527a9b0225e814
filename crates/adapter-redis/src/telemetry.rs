//! What the rate programs' replies tell about the clocks, as metrics: how far the Redis clock
//! is from this host's, and how often a policy's stored time was ahead of it.
//!
//! Sampled from the replies the provider receives anyway (every reply carries the server's
//! `TIME` and the effective time the program computed with): no extra command. Handles are
//! registered once per policy (held by the provider's per-policy plan), so a reply costs a
//! few atomic operations and one read of the system clock.
//!
//! The skew is read at the reply's receipt, so it includes up to one network round trip (the
//! server read `TIME` before the reply travelled back, and waited in the connection's
//! queue): it reads low by that much, and a value within a round trip of 0 is agreement.
//!
//! | metric | labels | what |
//! | --- | --- | --- |
//! | [`names::CLOCK_SKEW`] | | gauge: the last reply's server time minus this host's wall clock at its receipt, in seconds (signed) |
//! | [`names::CLOCK_EVENTS`] | `policy`, `kind` | `clamped`: the program computed with a stored time later than the server's; `unsafe`: `CLOCK_UNSAFE`, the server clock fell behind beyond the policy's bound |

use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge};
use shared_contract::PolicyId;

use crate::reply::{Reply, Status};
use crate::reply_multi::MultiReply;

/// Metric names, as `/metrics` shows them.
pub mod names {
    /// Gauge: the last reply's server time minus this host's clock at its receipt, in seconds.
    pub const CLOCK_SKEW: &str = "rate_limit_redis_clock_skew_seconds";
    /// Clock events by `policy` and `kind` (`clamped`, `unsafe`).
    pub const CLOCK_EVENTS: &str = "rate_limit_clock_events_total";
}

/// One policy's clock handles (and the shared skew gauge), registered once.
#[derive(Debug, Clone)]
pub struct ClockMetrics {
    clamped: Counter,
    unsafe_clock: Counter,
    skew: Gauge,
}

impl ClockMetrics {
    /// Registers `policy`'s handles with the installed recorder (without one, recording is a
    /// no-op).
    pub fn new(policy: &PolicyId) -> Self {
        let c = |kind: &'static str| metrics::counter!(names::CLOCK_EVENTS, "policy" => policy.as_str().to_owned(), "kind" => kind);
        Self {
            clamped: c("clamped"),
            unsafe_clock: c("unsafe"),
            skew: metrics::gauge!(names::CLOCK_SKEW),
        }
    }

    /// Observes the single program's reply, which parsed and made sense.
    pub fn single(&self, reply: &Reply) {
        self.member(reply);
        self.skew(reply.server_now_ms);
    }

    /// Observes a multi-limit reply, which parsed and made sense: each row under its member's
    /// handles (`members`, in member order). A replayed reply is the stored first answer, its
    /// times are not now's: it is not observed.
    pub fn multi<'a>(reply: &MultiReply, members: impl IntoIterator<Item = &'a ClockMetrics>) {
        if reply.replayed {
            return;
        }
        let mut members = members.into_iter().zip(&reply.rows).peekable();
        // Every row carries the same `TIME`: the first one sets the gauge.
        if let Some((m, row)) = members.peek() {
            m.skew(row.server_now_ms);
        }
        for (m, row) in members {
            m.member(row);
        }
    }

    /// Counts one member's clock event: `unsafe` for `CLOCK_UNSAFE`, `clamped` for a decision
    /// computed at a stored time later than the server's (the model's clock rule clamped a
    /// regressed clock).
    fn member(&self, row: &Reply) {
        match row.status {
            Status::ClockUnsafe => self.unsafe_clock.increment(1),
            Status::Allowed | Status::Denied if row.effective_now_ms > row.server_now_ms => {
                self.clamped.increment(1);
            }
            _ => {}
        }
    }

    /// Sets the skew gauge to `server_now_ms` minus this host's wall clock now, in seconds.
    /// A reply without a server time (0: a refused header) leaves it as it is.
    fn skew(&self, server_now_ms: u64) {
        if server_now_ms == 0 {
            return;
        }
        let local_ms = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as f64,
            Err(before) => -(before.duration().as_millis() as f64),
        };
        // Both are below 2^53: exact as f64.
        self.skew.set((server_now_ms as f64 - local_ms) / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

    use super::*;

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64
    }

    fn row(status: Status, server_now_ms: u64, effective_now_ms: u64) -> Reply {
        Reply {
            status,
            server_now_ms,
            effective_now_ms,
            limit: 5,
            remaining: 0,
            retry_after_ms: 0,
            reset_at_ms: effective_now_ms,
        }
    }

    /// Handles of policies `a` and `b`, registered with a recorder of their own.
    fn handles() -> (ClockMetrics, ClockMetrics, PrometheusHandle) {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let (a, b) = metrics::with_local_recorder(&recorder, || {
            let id = |s| PolicyId::new(s).expect("valid id");
            (ClockMetrics::new(&id("a")), ClockMetrics::new(&id("b")))
        });
        (a, b, handle)
    }

    /// The value of the series `name{labels}` (labels in registration order), if shown.
    fn value(handle: &PrometheusHandle, series: &str) -> Option<f64> {
        let text = handle.render();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    fn events(handle: &PrometheusHandle, policy: &str, kind: &str) -> Option<f64> {
        let series = format!(
            "{}{{policy=\"{policy}\",kind=\"{kind}\"}}",
            names::CLOCK_EVENTS
        );
        value(handle, &series)
    }

    #[test]
    fn skew_is_the_server_time_minus_the_local_clock_in_signed_seconds() {
        let (a, _, handle) = handles();
        let now = now_ms();
        a.single(&row(Status::Allowed, now + 60_000, now + 60_000));
        let ahead = value(&handle, names::CLOCK_SKEW).expect("a gauge");
        assert!((59.0..=60.0).contains(&ahead), "{ahead}");
        a.single(&row(Status::Denied, now - 30_000, now - 30_000));
        let behind = value(&handle, names::CLOCK_SKEW).expect("a gauge");
        assert!((-31.0..=-30.0).contains(&behind), "{behind}");
    }

    #[test]
    fn a_decision_at_a_later_effective_time_counts_clamped_and_clock_unsafe_counts_unsafe() {
        let (a, _, handle) = handles();
        let now = now_ms();
        a.single(&row(Status::Allowed, now, now));
        a.single(&row(Status::Denied, now, now + 500));
        a.single(&row(Status::ClockUnsafe, now, now + 60_000));
        a.single(&row(Status::StateIncompatible, now, 0));
        assert_eq!(events(&handle, "a", "clamped"), Some(1.0));
        assert_eq!(events(&handle, "a", "unsafe"), Some(1.0));
    }

    #[test]
    fn a_multi_reply_counts_each_row_under_its_member_unless_replayed() {
        let (a, b, handle) = handles();
        let now = now_ms();
        let mut reply = MultiReply {
            status: Status::ClockUnsafe,
            replayed: false,
            index: 2,
            rows: vec![
                row(Status::Allowed, now + 10_000, now + 10_500),
                row(Status::ClockUnsafe, now + 10_000, now + 70_000),
            ],
        };
        ClockMetrics::multi(&reply, [&a, &b]);
        assert_eq!(events(&handle, "a", "clamped"), Some(1.0));
        assert_eq!(events(&handle, "a", "unsafe"), Some(0.0));
        assert_eq!(events(&handle, "b", "unsafe"), Some(1.0));
        let skew = value(&handle, names::CLOCK_SKEW).expect("a gauge");
        assert!((9.0..=10.0).contains(&skew), "{skew}");
        // The stored first answer of an evaluation id, replayed: its times are not now's.
        reply.replayed = true;
        reply.rows[0].server_now_ms = now - 100_000;
        ClockMetrics::multi(&reply, [&a, &b]);
        assert_eq!(events(&handle, "a", "clamped"), Some(1.0));
        assert_eq!(events(&handle, "b", "unsafe"), Some(1.0));
        assert_eq!(value(&handle, names::CLOCK_SKEW), Some(skew));
    }
}
