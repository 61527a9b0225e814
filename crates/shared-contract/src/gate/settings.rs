//! Gate settings: the mode, the event duration, and the bounds that keep a gate's memory
//! finite. Construction refuses any value whose arithmetic could leave Lua's exact integer
//! range, exactly like the rate-limit policies, so providers never re-check it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::ids::GateId;
use crate::policy::{PolicyError, PolicyErrors, millis};

/// Largest accepted `max_events`: a gate never holds more events (incubating plus retained
/// terminal ones) nor more live key windows than this.
pub const MAX_EVENTS_LIMIT: u64 = 100_000_000;

/// How a gate decides that two events of one key conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateMode {
    /// A sliding window from the last *submitted* event of the key: events within `duration`
    /// of it are rejected, the submitted one stands.
    OnlyOnce,
    /// Events of one key must be at least `duration` apart, or none is valid: a conflicting
    /// event is rejected and the incubating event it conflicts with is invalidated. The
    /// window runs from the last *received* event of the key, whatever its fate.
    StrictlyOnce,
}

impl GateMode {
    /// Every mode, in configuration order.
    pub const ALL: [GateMode; 2] = [GateMode::OnlyOnce, GateMode::StrictlyOnce];

    /// The configuration name (`"only_once"`, `"strictly_once"`).
    pub fn as_str(self) -> &'static str {
        match self {
            GateMode::OnlyOnce => "only_once",
            GateMode::StrictlyOnce => "strictly_once",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl fmt::Display for GateMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Unvalidated gate fields, as a configuration layer reads them; [`GateSettings::new`] checks
/// them all. [`GateSpec::new`] fills the optional ones with their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSpec {
    /// How configuration, requests and keys name the gate; unique within a [`GateSet`].
    pub id: GateId,
    /// How events of one key conflict.
    pub mode: GateMode,
    /// The event duration: how far apart events of one key must be, and how long a submitted
    /// event incubates before it is published.
    pub duration: Duration,
    /// How long a terminal (published or invalidated) event stays queryable, counted from the
    /// moment it became terminal. Then the conditional delete removes it.
    pub retention: Duration,
    /// The most events (incubating plus retained) and the most live key windows a gate holds.
    pub max_events: u64,
    /// How far the provider's clock may go back before the gate refuses to act (within it,
    /// the gate keeps using the latest time it has seen).
    pub max_clock_regression: Duration,
}

impl GateSpec {
    /// Default `retention`: one hour.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);
    /// Default `max_events`.
    pub const DEFAULT_MAX_EVENTS: u64 = 1_000_000;
    /// Default `max_clock_regression`, the same as the rate-limit policies' usual value.
    pub const DEFAULT_MAX_CLOCK_REGRESSION: Duration = Duration::from_secs(2);

    /// A spec with the defaults for every optional field.
    pub fn new(id: GateId, mode: GateMode, duration: Duration) -> Self {
        Self {
            id,
            mode,
            duration,
            retention: Self::DEFAULT_RETENTION,
            max_events: Self::DEFAULT_MAX_EVENTS,
            max_clock_regression: Self::DEFAULT_MAX_CLOCK_REGRESSION,
        }
    }
}

/// Validated, frozen settings of one gate.
///
/// Every time the model forms is `now + duration` or `terminal_at + retention` with
/// `now <= MAX_TIME_MS` (2^48-1) and both durations `<= MAX_DURATION_MS` (2^40-1), so no sum
/// comes near 2^53-1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSettings {
    id: GateId,
    mode: GateMode,
    duration_ms: u64,
    retention_ms: u64,
    max_events: u64,
    max_clock_regression_ms: u64,
}

impl GateSettings {
    /// Validates every field of `spec`.
    ///
    /// # Errors
    /// [`PolicyErrors`] with one entry per refused field, named by its configuration key
    /// (`duration`, `retention`, `max_events`, `max_clock_regression`).
    pub fn new(spec: GateSpec) -> Result<Self, PolicyErrors> {
        let mut errors = Vec::new();
        let duration_ms = millis(&mut errors, "duration", spec.duration, 1);
        let retention_ms = millis(&mut errors, "retention", spec.retention, 1);
        let max_clock_regression_ms = millis(
            &mut errors,
            "max_clock_regression",
            spec.max_clock_regression,
            0,
        );
        if spec.max_events == 0 || spec.max_events > MAX_EVENTS_LIMIT {
            errors.push(PolicyError {
                field: "max_events",
                problem: format!(
                    "must be between 1 and {MAX_EVENTS_LIMIT}, got {}",
                    spec.max_events
                ),
            });
        }
        match (duration_ms, retention_ms, max_clock_regression_ms) {
            (Some(duration_ms), Some(retention_ms), Some(max_clock_regression_ms))
                if errors.is_empty() =>
            {
                Ok(Self {
                    id: spec.id,
                    mode: spec.mode,
                    duration_ms,
                    retention_ms,
                    max_events: spec.max_events,
                    max_clock_regression_ms,
                })
            }
            _ => Err(PolicyErrors(errors)),
        }
    }

    /// How configuration, requests and keys name the gate.
    pub fn id(&self) -> &GateId {
        &self.id
    }
    /// How events of one key conflict.
    pub fn mode(&self) -> GateMode {
        self.mode
    }
    /// The event duration in ms (>= 1).
    pub fn duration_ms(&self) -> u64 {
        self.duration_ms
    }
    /// How long a terminal event is kept, in ms (>= 1).
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }
    /// The most events (incubating plus retained) and the most live key windows the gate holds:
    /// `1..=MAX_EVENTS_LIMIT`.
    pub fn max_events(&self) -> u64 {
        self.max_events
    }
    /// How far the provider's clock may go back, in ms, before the gate refuses to act.
    pub fn max_clock_regression_ms(&self) -> u64 {
        self.max_clock_regression_ms
    }
}

/// Why a set of gates was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateSetError {
    /// Two gates have this id.
    #[error("gate {0} is defined twice")]
    Duplicate(GateId),
}

/// The gates of one provider, by id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GateSet {
    gates: BTreeMap<GateId, GateSettings>,
}

impl GateSet {
    /// # Errors
    /// [`GateSetError::Duplicate`] when two settings share an id.
    pub fn new(gates: impl IntoIterator<Item = GateSettings>) -> Result<Self, GateSetError> {
        let mut map = BTreeMap::new();
        for g in gates {
            if let Some(dup) = map.insert(g.id().clone(), g) {
                return Err(GateSetError::Duplicate(dup.id().clone()));
            }
        }
        Ok(Self { gates: map })
    }

    /// The settings of this gate; `None` when there is none.
    pub fn get(&self, id: &GateId) -> Option<&GateSettings> {
        self.gates.get(id)
    }

    /// Every gate's settings, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &GateSettings> {
        self.gates.values()
    }

    /// Whether the set holds no gate.
    pub fn is_empty(&self) -> bool {
        self.gates.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::MAX_DURATION_MS;

    fn spec(duration: Duration) -> GateSpec {
        GateSpec::new(
            GateId::new("orders").expect("valid id"),
            GateMode::StrictlyOnce,
            duration,
        )
    }

    fn fields(r: Result<GateSettings, PolicyErrors>) -> Vec<&'static str> {
        r.err()
            .map(|e| e.0.iter().map(|e| e.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_bad_field_is_reported_by_name_at_once() {
        let mut s = spec(Duration::ZERO);
        s.retention = Duration::from_micros(1500);
        s.max_events = 0;
        s.max_clock_regression = Duration::from_millis(MAX_DURATION_MS + 1);
        assert_eq!(
            fields(GateSettings::new(s)),
            vec![
                "duration",
                "retention",
                "max_clock_regression",
                "max_events"
            ]
        );
    }

    #[test]
    fn durations_are_positive_whole_milliseconds_within_the_exact_range() {
        assert!(GateSettings::new(spec(Duration::from_millis(1))).is_ok());
        assert!(GateSettings::new(spec(Duration::from_millis(MAX_DURATION_MS))).is_ok());
        assert_eq!(
            fields(GateSettings::new(spec(Duration::from_millis(
                MAX_DURATION_MS + 1
            )))),
            vec!["duration"]
        );
        assert_eq!(
            fields(GateSettings::new(spec(Duration::from_nanos(3_000_000_001)))),
            vec!["duration"]
        );
    }

    #[test]
    fn zero_clock_regression_is_allowed_but_max_events_is_bounded() {
        let mut s = spec(Duration::from_secs(3));
        s.max_clock_regression = Duration::ZERO;
        assert!(GateSettings::new(s.clone()).is_ok());
        s.max_events = MAX_EVENTS_LIMIT + 1;
        assert_eq!(fields(GateSettings::new(s)), vec!["max_events"]);
    }

    #[test]
    fn mode_names_round_trip() {
        for m in GateMode::ALL {
            assert_eq!(GateMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(GateMode::parse("exactly_once"), None);
    }

    #[test]
    fn a_gate_set_refuses_duplicate_ids() {
        let g = GateSettings::new(spec(Duration::from_secs(3))).expect("valid settings");
        assert!(GateSet::new([g.clone()]).is_ok());
        assert!(GateSet::new([g.clone(), g]).is_err());
    }
}
