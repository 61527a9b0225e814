//! An event gate embedded in a service: "send the order confirmation only once per 3 s per
//! order", on the in-memory provider built in code (no configuration, no Redis). Time is a
//! manual clock here so the example runs instantly; a service passes `SystemClock` and runs
//! `LocalGatePublisher` to publish due events without traffic.
//!
//! ```sh
//! cargo run -p adapter-local --example event_gate
//! ```

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use adapter_local::LocalGateProvider;
use shared_contract::gate::{
    EventGatePort, EventId, EventKey, GateId, GateMode, GateOutcome, GateSet, GateSettings,
    GateSpec, SubmitOutcome, SubmitRequest,
};
use shared_contract::{Deadline, ManualClock};

type Error = Box<dyn std::error::Error>;

/// Submits event `id` of `key`: a retry with the same id is always safe.
async fn submit(
    port: &dyn EventGatePort,
    gate: &GateId,
    key: &str,
    id: &str,
) -> Result<GateOutcome<SubmitOutcome>, Error> {
    let request = SubmitRequest {
        gate: gate.clone(),
        key: EventKey::new(key)?,
        id: EventId::new(id)?,
        deadline: Deadline::within(Duration::from_millis(100))?,
    };
    Ok(port.submit(request).await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let gate = GateId::new("confirmations")?;
    let settings = GateSettings::new(GateSpec::new(
        gate.clone(),
        GateMode::OnlyOnce,
        Duration::from_secs(3),
    ))?;
    let clock = ManualClock::new(1_700_000_000_000);
    let port = LocalGateProvider::new(GateSet::new([settings])?, Arc::new(clock.clone()));

    for (key, id) in [("order-7", "e-1"), ("order-7", "e-2"), ("order-7", "e-1")] {
        match submit(&port, &gate, key, id).await? {
            GateOutcome::Evaluated(SubmitOutcome::Submitted { publish_at_ms, .. }) => {
                println!("{id}: submitted, published at {publish_at_ms} unless invalidated");
            }
            GateOutcome::Evaluated(SubmitOutcome::Rejected { conflicts_with, .. }) => {
                println!("{id}: rejected, {key} already has {conflicts_with} in this period");
            }
            GateOutcome::Evaluated(SubmitOutcome::Duplicate(record)) => {
                println!(
                    "{id}: a retry of an event the gate holds ({:?})",
                    record.status
                );
            }
            GateOutcome::Evaluated(SubmitOutcome::IdReused(record)) => {
                println!(
                    "{id}: the id belongs to another key ({}): a client bug",
                    record.key
                );
            }
            // Unavailable / Indeterminate / Incompatible: the local provider never answers
            // them, a Redis one may; an Indeterminate submission is safe to retry with the
            // same id (the retry answers Duplicate when the first one went through).
            other => println!("{id}: not decided: {other:?}"),
        }
    }

    // Three seconds later the first event is due; publishing it is the moment to act.
    clock.advance(3_000);
    let deadline = Deadline::within(Duration::from_millis(100))?;
    let published = port
        .publish_due(&gate, NonZeroUsize::MIN.saturating_add(99), deadline)
        .await?;
    println!("published now: {published:?}");
    let deadline = Deadline::within(Duration::from_millis(100))?;
    let e1 = port.event(&gate, &EventId::new("e-1")?, deadline).await?;
    println!("e-1: {e1:?}");
    Ok(())
}
