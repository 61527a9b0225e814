//! The stored-settings check: whether a gate's state in Redis was written with the mode and
//! duration this instance is configured with.
//!
//! Every gate program refuses state written with another mode or duration
//! (`STATE_INCOMPATIBLE`, nothing changed), so such a gate fails every call. The provider
//! reads the two stored values (`HGET` of the meta hash) for its readiness and reports a
//! mismatch by gate with both values; [`compare`] is the pure part. `check_at_start` runs it
//! once at start-up so that a mismatch is logged without waiting for a probe.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use shared_contract::gate::{GateId, GateSettings};

/// A gate whose stored state holds other settings than configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSettingsMismatch {
    /// The gate whose stored state differs.
    pub gate: GateId,
    /// The stored `mode` (as stored, at most 64 characters shown).
    pub stored_mode: String,
    /// The stored `duration` in ms (as stored, at most 64 characters shown).
    pub stored_duration_ms: String,
    /// The mode this instance is configured with.
    pub configured_mode: &'static str,
    /// The duration this instance is configured with, in ms.
    pub configured_duration_ms: u64,
}

impl fmt::Display for StoredSettingsMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event gate {}: stored state has mode {} and duration {} ms, configured mode {} and duration {} ms; every call fails until they match (or the gate's keys are removed)",
            self.gate,
            self.stored_mode,
            self.stored_duration_ms,
            self.configured_mode,
            self.configured_duration_ms
        )
    }
}

/// Longest stored value shown (the fields are client-independent, but bound them anyway).
const SHOWN: usize = 64;

fn shown(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).chars().take(SHOWN).collect()
}

/// Compares the stored `mode` and `duration` of `gate` (`None`: nothing stored yet, a new
/// gate) with its configuration; `Some` when the programs would refuse the state.
pub fn compare(
    gate: &GateSettings,
    stored_mode: Option<&[u8]>,
    stored_duration: Option<&[u8]>,
) -> Option<StoredSettingsMismatch> {
    let mode = gate.mode().as_str();
    let duration = gate.duration_ms().to_string();
    // The programs check the mode only when one is stored, and then the duration with it.
    let stored = stored_mode?;
    if stored == mode.as_bytes() && stored_duration == Some(duration.as_bytes()) {
        return None;
    }
    Some(StoredSettingsMismatch {
        gate: gate.id().clone(),
        stored_mode: shown(stored),
        stored_duration_ms: stored_duration.map_or_else(|| "(none)".to_owned(), shown),
        configured_mode: mode,
        configured_duration_ms: gate.duration_ms(),
    })
}

/// One read of every gate's stored settings (the provider's `stored_settings`).
pub(super) type Attempt =
    Pin<Box<dyn Future<Output = Result<Vec<StoredSettingsMismatch>, String>> + Send>>;

/// How long the start-up check of the stored settings keeps trying while Redis does not
/// answer.
pub const STORED_SETTINGS_CHECK_FOR: Duration = Duration::from_secs(60);

/// The start-up check of the gates' stored settings: the pool connects in the background, so
/// it retries until Redis answers (at most [`STORED_SETTINGS_CHECK_FOR`]); a mismatch is
/// logged by `Gates::stored_settings`. Not a start-up failure: Redis may be down at
/// start-up, and readiness has to report a mismatch later anyway. Ends with the provider.
/// `attempt` answers `None` once the provider is gone.
pub(super) async fn check_at_start(mut attempt: impl FnMut() -> Option<Attempt>) {
    let until = Instant::now() + STORED_SETTINGS_CHECK_FOR;
    loop {
        let Some(checked) = attempt() else {
            return;
        };
        match checked.await {
            Ok(m) => {
                if m.is_empty() {
                    tracing::info!("event gates: stored settings match the configuration");
                }
                return;
            }
            Err(why) if Instant::now() >= until => {
                tracing::warn!(%why, "event gates: stored settings not checked at start-up");
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::gate::{GateMode, GateSpec};

    use super::*;

    fn gate() -> GateSettings {
        GateSettings::new(GateSpec::new(
            GateId::new("orders").expect("id"),
            GateMode::OnlyOnce,
            Duration::from_secs(3),
        ))
        .expect("gate")
    }

    #[test]
    fn new_or_matching_state_is_fine_and_another_duration_or_mode_is_named() {
        let g = gate();
        assert_eq!(compare(&g, None, None), None);
        assert_eq!(compare(&g, Some(b"only_once"), Some(b"3000")), None);
        let m = compare(&g, Some(b"only_once"), Some(b"5000")).expect("mismatch");
        assert_eq!(
            m.to_string(),
            "event gate orders: stored state has mode only_once and duration 5000 ms, configured mode only_once and duration 3000 ms; every call fails until they match (or the gate's keys are removed)"
        );
        let m = compare(&g, Some(b"strictly_once"), Some(b"3000")).expect("mismatch");
        assert_eq!(m.stored_mode, "strictly_once");
        let long = vec![b'x'; 1000];
        let m = compare(&g, Some(&long), None).expect("mismatch");
        assert_eq!(
            (m.stored_mode.len(), m.stored_duration_ms.as_str()),
            (64, "(none)")
        );
    }
}
