//! The local gate's background publisher (feature `publisher`): a Tokio task that publishes
//! every gate's due events on time even when nothing calls the gate, and removes expired
//! terminal events, as the Redis gate provider's own publisher does for its gates.
//!
//! The provider never needs it to be correct (every call publishes lazily, see the module
//! above); it makes publications timely for an application that only watches the update log.
//! It is the one part of this crate that needs a runtime, so it is behind a feature.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use shared_contract::Deadline;
use shared_contract::gate::{EventGatePort, GateOutcome};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

use super::LocalGateProvider;

/// The running publisher task and what stops it.
#[derive(Debug)]
pub struct LocalGatePublisher {
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl LocalGatePublisher {
    /// How often due events are published (and, every 100th round, expired ones swept).
    pub const INTERVAL: Duration = Duration::from_millis(10);
    /// Events published or removed per gate per round.
    pub const BATCH: NonZeroUsize = NonZeroUsize::new(1024).expect("1024 > 0");
    /// The deadline each round's calls carry (the local provider answers at once).
    const BUDGET: Duration = Duration::from_secs(1);

    /// Starts publishing every gate of `provider`. Must be called inside a Tokio runtime.
    pub fn spawn(provider: Arc<LocalGateProvider>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(provider, stopped));
        Self {
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Stops the task and waits for it. Idempotent.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.lock().await.take() {
            let _ = t.await;
        }
    }
}

async fn run(provider: Arc<LocalGateProvider>, mut stopped: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(LocalGatePublisher::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return,
        }
        if *stopped.borrow() {
            return;
        }
        round = round.wrapping_add(1);
        publish_round(&provider, round.is_multiple_of(100)).await;
    }
}

/// Publishes what is due in every gate, and sweeps each when `sweep`.
async fn publish_round(provider: &LocalGateProvider, sweep: bool) {
    let batch = LocalGatePublisher::BATCH;
    for g in provider.gates().iter() {
        let Ok(deadline) = Deadline::within(LocalGatePublisher::BUDGET) else {
            continue;
        };
        match provider.publish_due(g.id(), batch, deadline).await {
            Ok(GateOutcome::Evaluated(_)) => {}
            Ok(other) => {
                tracing::debug!(gate = %g.id(), outcome = other.name(), "publish_due");
            }
            Err(e) => tracing::warn!(error = %e, "publish_due"),
        }
        if sweep {
            let _ = provider.sweep(g.id(), batch, deadline).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use shared_contract::ManualClock;
    use shared_contract::gate::{
        EventId, EventKey, GateId, GateMode, GateSet, GateSettings, GateSpec, SubmitOutcome,
        SubmitRequest,
    };

    use super::*;

    fn gate_set() -> GateSet {
        let spec = GateSpec::new(
            GateId::new("g").expect("id"),
            GateMode::OnlyOnce,
            Duration::from_millis(30),
        );
        GateSet::new([GateSettings::new(spec).expect("valid gate")]).expect("valid set")
    }

    fn deadline() -> Deadline {
        Deadline::within(Duration::from_secs(1)).expect("deadline")
    }

    async fn submit(p: &LocalGateProvider, id: &str) {
        let answer = p
            .submit(SubmitRequest {
                gate: GateId::new("g").expect("id"),
                key: EventKey::new(id).expect("key"),
                id: EventId::new(id).expect("id"),
                deadline: deadline(),
            })
            .await
            .expect("known gate");
        assert!(matches!(
            answer,
            GateOutcome::Evaluated(SubmitOutcome::Submitted { .. })
        ));
    }

    /// Events still due: `publish_due` publishes them itself, so its count says whether the
    /// publisher got there first.
    async fn left_to_publish(p: &LocalGateProvider) -> usize {
        let g = GateId::new("g").expect("id");
        match p
            .publish_due(&g, LocalGatePublisher::BATCH, deadline())
            .await
        {
            Ok(GateOutcome::Evaluated(n)) => n,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn due_events_are_published_without_traffic_until_shutdown() {
        let clock = ManualClock::new(1_000);
        let provider = Arc::new(LocalGateProvider::new(gate_set(), Arc::new(clock.clone())));
        let publisher = LocalGatePublisher::spawn(provider.clone());
        submit(&provider, "a").await;
        clock.advance(30);
        tokio::time::sleep(LocalGatePublisher::INTERVAL * 2).await;
        assert_eq!(
            left_to_publish(&provider).await,
            0,
            "the publisher published it"
        );

        publisher.shutdown().await;
        publisher.shutdown().await;
        submit(&provider, "b").await;
        clock.advance(30);
        tokio::time::sleep(LocalGatePublisher::INTERVAL * 2).await;
        assert_eq!(
            left_to_publish(&provider).await,
            1,
            "stopped: nothing published"
        );
    }
}
