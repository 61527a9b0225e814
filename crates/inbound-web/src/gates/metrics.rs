//! Event-gate metrics. Submissions are counted where they are answered (the HTTP handler);
//! what happens to events afterwards (published, invalidated, how late, how many incubate) is
//! learnt by one built-in subscriber per gate that follows the gate's lossless [`Feed`], so
//! the figures are the same whichever provider runs the gate and whoever publishes (this
//! instance's publisher, another instance's, or the Redis publisher task).
//!
//! | metric | labels | what |
//! | --- | --- | --- |
//! | `event_gate_submissions_total` | `gate`, `outcome` | submissions by answer: `submitted`, `rejected`, `duplicate`, `id_reused`, `unavailable`, `indeterminate`, `incompatible`, `refused` |
//! | `event_gate_published_total` | `gate` | events seen published |
//! | `event_gate_invalidated_total` | `gate` | events seen invalidated |
//! | `event_gate_incubating` | `gate` | events incubating now (as the observer's replica holds them) |
//! | `event_gate_publication_lag_seconds` | `gate` | histogram: publication time minus the time the event was due |
//! | `event_gate_subscribers` | `gate` | open stream subscribers |
//!
//! With several instances every one observes the whole gate: sum submissions over
//! instances, but read the published and invalidated counts of one instance.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use app_bootstrap::GateRuntime;
use shared_contract::gate::{EventStatus, Feed, FeedTiming, Frame, GateId, GateOutcome, Step};

/// The metric names.
pub mod names {
    /// Submissions by `gate` and `outcome`.
    pub const SUBMISSIONS: &str = "event_gate_submissions_total";
    /// Events seen published, by `gate`.
    pub const PUBLISHED: &str = "event_gate_published_total";
    /// Events seen invalidated, by `gate`.
    pub const INVALIDATED: &str = "event_gate_invalidated_total";
    /// Gauge: events incubating now, by `gate`.
    pub const INCUBATING: &str = "event_gate_incubating";
    /// Histogram: publication time minus the time the event was due, in seconds, by `gate`.
    pub const PUBLICATION_LAG: &str = "event_gate_publication_lag_seconds";
    /// Gauge: open stream subscribers, by `gate`.
    pub const SUBSCRIBERS: &str = "event_gate_subscribers";
}

/// Counts one submission's answer.
pub fn submission(gate: &GateId, outcome: &'static str) {
    metrics::counter!(names::SUBMISSIONS, "gate" => gate.as_str().to_owned(), "outcome" => outcome)
        .increment(1);
}

/// The name of a not-evaluated gate outcome, as `outcome` label.
pub fn not_evaluated_name<T>(outcome: &GateOutcome<T>) -> &'static str {
    match outcome {
        GateOutcome::Evaluated(_) => "evaluated",
        GateOutcome::Unavailable { .. } => "unavailable",
        GateOutcome::Indeterminate { .. } => "indeterminate",
        GateOutcome::Incompatible { .. } => "incompatible",
    }
}

/// Sets the subscriber gauge of `gate`.
pub fn subscribers(gate: &GateId, n: usize) {
    metrics::gauge!(names::SUBSCRIBERS, "gate" => gate.as_str().to_owned()).set(n as f64);
}

/// A fresh snapshot a minute (the replica is rebuilt from it); updates in between.
const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(60);
/// The longest wait of one pull for new updates (as the streams wait).
const PULL_WAIT: Duration = Duration::from_millis(500);

/// Updates per pull.
const BATCH: usize = 256;

/// Starts one observer per gate of `rt`; they run until aborted.
pub fn spawn(rt: &Arc<GateRuntime>) -> Vec<tokio::task::JoinHandle<()>> {
    rt.port()
        .gates()
        .iter()
        .map(|g| {
            let rt = Arc::clone(rt);
            let gate = g.id().clone();
            tokio::spawn(async move { observe(&rt, gate).await })
        })
        .collect()
}

async fn observe(rt: &GateRuntime, gate: GateId) {
    let label = gate.as_str().to_owned();
    let published = metrics::counter!(names::PUBLISHED, "gate" => label.clone());
    let invalidated = metrics::counter!(names::INVALIDATED, "gate" => label.clone());
    let incubating = metrics::gauge!(names::INCUBATING, "gate" => label.clone());
    let lag = metrics::histogram!(names::PUBLICATION_LAG, "gate" => label);
    let max = NonZeroUsize::new(BATCH).unwrap_or(NonZeroUsize::MIN);
    let start = Instant::now();
    let timing = FeedTiming {
        snapshot_interval: SNAPSHOT_INTERVAL,
        budget: rt.budget(),
        pull_wait: PULL_WAIT,
    };
    let mut feed = Feed::new(gate.clone(), max, timing);
    // Events that ended before the observer's first snapshot are not counted: it starts
    // from what the gate holds now.
    loop {
        let now_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        match feed.step(rt.port().as_ref(), now_ms).await {
            Ok(Step::Send(frames)) => {
                for f in &frames {
                    if let Frame::Status(u) = f {
                        match u.status {
                            EventStatus::Published => {
                                published.increment(1);
                                let late_ms = u.at_ms.saturating_sub(u.publish_at_ms);
                                lag.record(late_ms as f64 / 1000.0);
                            }
                            EventStatus::Invalidated => invalidated.increment(1),
                            _ => {}
                        }
                    }
                }
                incubating.set(feed.replica().len() as f64);
            }
            Ok(Step::Wait(wait)) => tokio::time::sleep(wait).await,
            Err(e) => {
                tracing::warn!(gate = %gate, error = %e, "gate metrics observer stopped");
                return;
            }
        }
    }
}
