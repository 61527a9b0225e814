//! Calendar periods of a fixed window (`window = "calendar:month"`): windows that start at a
//! calendar boundary in a time zone instead of every `window` ms from the epoch, for quotas
//! per hour, day, week or month.
//!
//! Boundaries, in the policy's zone (UTC by default, or an IANA name):
//! - `hour`: when the zone's clock shows a whole hour (`:00`). Hours are absolute time, so a
//!   clock set back repeats no hour of quota, and one set forward skips none.
//! - `day`: the first instant of each civil date (midnight, or the first time that exists
//!   when midnight is skipped); a day of a DST change lasts 23 or 25 hours, and its quota is
//!   one day's.
//! - `week`: the first instant of each Monday (ISO weeks).
//! - `month`: the first instant of the first day of each month.
//!
//! The zone database is compiled in, so a zone's rules are those of this build.

use std::fmt;
use std::sync::{Mutex, OnceLock};

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// The unit of a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// A whole hour of the zone's clock.
    Hour,
    /// A civil day.
    Day,
    /// An ISO week, from Monday.
    Week,
    /// A calendar month.
    Month,
}

impl CalendarUnit {
    /// Every unit, in size order.
    pub const ALL: [CalendarUnit; 4] = [
        CalendarUnit::Hour,
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
    ];

    /// The configuration name (`hour`, `day`, `week`, `month`).
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Hour => "hour",
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
        }
    }

    /// Parses a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.as_str() == name)
    }

    /// The longest window of this unit in ms, over any zone: what the reset horizon and the
    /// state lifetime take (a DST day is 25 hours, a month 31 days and one hour).
    pub fn longest_ms(self) -> u64 {
        const HOUR: u64 = 3_600_000;
        match self {
            // Offsets change by whole minutes: an hour of the clock may end early, never late.
            CalendarUnit::Hour => HOUR,
            CalendarUnit::Day => 25 * HOUR,
            CalendarUnit::Week => 7 * 24 * HOUR + HOUR,
            CalendarUnit::Month => 31 * 24 * HOUR + HOUR,
        }
    }
}

impl fmt::Display for CalendarUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A zone by name, resolved once per process and kept (the names in use are few).
#[derive(Debug)]
struct Zone {
    name: Box<str>,
    tz: TimeZone,
}

fn zones() -> &'static Mutex<Vec<&'static Zone>> {
    static ZONES: OnceLock<Mutex<Vec<&'static Zone>>> = OnceLock::new();
    ZONES.get_or_init(|| Mutex::new(Vec::new()))
}

/// The time zone `name` names (`UTC` or an IANA name, exactly as the database spells it).
fn zone(name: &str) -> Option<&'static Zone> {
    let mut known = zones()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(z) = known.iter().find(|z| &*z.name == name) {
        return Some(z);
    }
    let tz = if name == "UTC" {
        TimeZone::UTC
    } else {
        TimeZone::get(name).ok()?
    };
    // The database's spelling: a name in another case is the same zone.
    let canonical = tz.iana_name().unwrap_or(name);
    if let Some(z) = known.iter().find(|z| &*z.name == canonical) {
        return Some(z);
    }
    let z: &'static Zone = Box::leak(Box::new(Zone {
        name: canonical.into(),
        tz,
    }));
    known.push(z);
    Some(z)
}

/// A calendar period: its unit and time zone.
#[derive(Clone, Copy)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: &'static Zone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone.name == other.zone.name
    }
}

impl Eq for Calendar {}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({} in {})", self.unit, self.zone.name)
    }
}

impl Calendar {
    /// The period `unit` in the zone `time_zone` (`UTC` or an IANA name such as
    /// `Europe/Berlin`, in any case); `None` when no zone has that name.
    pub fn new(unit: CalendarUnit, time_zone: &str) -> Option<Self> {
        zone(time_zone).map(|zone| Self { unit, zone })
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's name, as the database spells it.
    pub fn time_zone(&self) -> &'static str {
        &self.zone.name
    }

    /// The hour of the clock holding `t` (`t_ms`): aligned to the offset in force, and cut at
    /// an offset change inside it (only a half-hour change, Lord Howe's, falls inside an hour),
    /// so that hours follow each other without gap or overlap.
    fn hour(&self, t: Timestamp, t_ms: u64) -> Option<(u64, u64)> {
        const HOUR: u64 = 3_600_000;
        let tz = &self.zone.tz;
        let ms = |ts: Timestamp| u64::try_from(ts.as_millisecond()).ok();
        let offset_ms = i64::from(tz.to_offset(t).seconds()) * 1_000;
        let local = i64::try_from(t_ms).ok()? + offset_ms;
        // Before the epoch's first local hour there is no window (`None`, like beyond 9999).
        let mut start = t_ms.checked_sub(u64::try_from(local.rem_euclid(HOUR as i64)).ok()?)?;
        let mut end = start + HOUR;
        // The last change at or before `t`, and the first after it.
        let after_t = Timestamp::from_millisecond(i64::try_from(t_ms + 1).ok()?).ok()?;
        if let Some(last) = tz
            .preceding(after_t)
            .next()
            .and_then(|tr| ms(tr.timestamp()))
        {
            start = start.max(last);
        }
        if let Some(next) = tz.following(t).map(|tr| tr.timestamp()).find(|&ts| ts > t) {
            end = end.min(ms(next)?);
        }
        Some((start, end))
    }

    /// The window holding `t_ms` (Unix ms): `[start, end)`, `start <= t_ms < end`; `None` beyond
    /// the year 9999, where civil time is not computed.
    pub fn bounds(&self, t_ms: u64) -> Option<(u64, u64)> {
        let t = Timestamp::from_millisecond(i64::try_from(t_ms).ok()?).ok()?;
        let ms = |ts: Timestamp| u64::try_from(ts.as_millisecond()).ok();
        if self.unit == CalendarUnit::Hour {
            return self.hour(t, t_ms);
        }
        let zoned = t.to_zoned(self.zone.tz.clone());
        let start = match self.unit {
            CalendarUnit::Week => {
                let back = i64::from(zoned.weekday().to_monday_zero_offset());
                let monday = zoned
                    .date()
                    .checked_sub(jiff::Span::new().days(back))
                    .ok()?;
                monday
                    .to_zoned(self.zone.tz.clone())
                    .ok()?
                    .start_of_day()
                    .ok()?
            }
            CalendarUnit::Month => zoned.first_of_month().ok()?.start_of_day().ok()?,
            _ => zoned.start_of_day().ok()?,
        };
        let next = match self.unit {
            CalendarUnit::Week => start.date().checked_add(jiff::Span::new().days(7)).ok()?,
            CalendarUnit::Month => start.date().checked_add(jiff::Span::new().months(1)).ok()?,
            _ => start.date().tomorrow().ok()?,
        };
        let end = next
            .to_zoned(self.zone.tz.clone())
            .ok()?
            .start_of_day()
            .ok()?;
        Some((ms(start.timestamp())?, ms(end.timestamp())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    /// Unix ms of an RFC 3339 instant.
    fn at(text: &str) -> u64 {
        let t: Timestamp = text.parse().expect("an instant");
        u64::try_from(t.as_millisecond()).expect("after 1970")
    }

    fn cal(unit: CalendarUnit, zone: &str) -> Calendar {
        Calendar::new(unit, zone).expect("a zone")
    }

    #[test]
    fn a_month_runs_from_its_first_day_to_the_next_months() {
        let utc = cal(CalendarUnit::Month, "UTC");
        let t = at("2026-02-28T23:59:59.999Z");
        assert_eq!(
            utc.bounds(t),
            Some((at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z")))
        );
        let berlin = cal(CalendarUnit::Month, "Europe/Berlin");
        // 1 March 00:30 in Berlin is still 28 February in UTC.
        let t = at("2026-02-28T23:30:00Z");
        assert_eq!(
            berlin.bounds(t),
            Some((at("2026-02-28T23:00:00Z"), at("2026-03-31T22:00:00Z")))
        );
    }

    #[test]
    fn a_day_of_a_dst_change_lasts_23_or_25_hours() {
        let berlin = cal(CalendarUnit::Day, "Europe/Berlin");
        let (start, end) = berlin.bounds(at("2026-03-29T12:00:00Z")).expect("in range");
        assert_eq!(
            (start, end - start),
            (at("2026-03-28T23:00:00Z"), 23 * HOUR)
        );
        let (start, end) = berlin.bounds(at("2026-10-25T12:00:00Z")).expect("in range");
        assert_eq!(
            (start, end - start),
            (at("2026-10-24T22:00:00Z"), 25 * HOUR)
        );
    }

    #[test]
    fn hours_are_whole_hours_of_the_clock_in_absolute_time() {
        let india = cal(CalendarUnit::Hour, "Asia/Kolkata");
        // +05:30: the clock's hours start at :30 UTC.
        assert_eq!(
            india.bounds(at("2026-06-01T10:10:00Z")),
            Some((at("2026-06-01T09:30:00Z"), at("2026-06-01T10:30:00Z")))
        );
        // The hour Berlin's clock repeats in October is two hours of quota, one after the other.
        let berlin = cal(CalendarUnit::Hour, "Europe/Berlin");
        let first = berlin.bounds(at("2026-10-25T00:30:00Z")).expect("in range");
        let second = berlin.bounds(at("2026-10-25T01:30:00Z")).expect("in range");
        assert_eq!(first.1, second.0);
    }

    #[test]
    fn a_week_starts_on_monday() {
        let utc = cal(CalendarUnit::Week, "UTC");
        // 2026-12-06 is a Sunday.
        assert_eq!(
            utc.bounds(at("2026-12-06T18:00:00Z")),
            Some((at("2026-11-30T00:00:00Z"), at("2026-12-07T00:00:00Z")))
        );
    }

    #[test]
    fn every_window_holds_its_instant_and_is_at_most_the_longest() {
        let zones = [
            "UTC",
            "Europe/Berlin",
            "America/Sao_Paulo",
            "Australia/Lord_Howe",
        ];
        for zone in zones {
            for unit in CalendarUnit::ALL {
                let c = cal(unit, zone);
                let mut t = at("2018-01-01T00:00:00Z");
                while t < at("2020-01-01T00:00:00Z") {
                    let (start, end) = c.bounds(t).expect("in range");
                    assert!(start <= t && t < end, "{c:?} at {t}");
                    assert!(
                        end - start <= unit.longest_ms(),
                        "{c:?} at {t}: {}",
                        end - start
                    );
                    // The next window starts where this one ends.
                    assert_eq!(c.bounds(end).map(|b| b.0), Some(end), "{c:?}");
                    t += 7 * HOUR + 13 * 60_000 + 7;
                }
            }
        }
    }

    #[test]
    fn unknown_zones_and_times_past_9999_have_no_calendar() {
        assert!(Calendar::new(CalendarUnit::Day, "Mars/Olympus").is_none());
        let lower = cal(CalendarUnit::Day, "europe/berlin");
        assert_eq!(lower.time_zone(), "Europe/Berlin");
        assert_eq!(lower, cal(CalendarUnit::Day, "Europe/Berlin"));
        let c = cal(CalendarUnit::Day, "UTC");
        assert_eq!(c.bounds(crate::policy::MAX_TIME_MS), None);
        // East of Greenwich the first local hour began before the epoch: no window, no
        // arithmetic underflow.
        let kolkata = cal(CalendarUnit::Hour, "Asia/Kolkata");
        assert_eq!(kolkata.bounds(100), None);
        assert_eq!(kolkata.bounds(1_800_000), Some((1_800_000, 5_400_000)));
        assert_eq!(c, cal(CalendarUnit::Day, "UTC"));
        assert_ne!(c, cal(CalendarUnit::Day, "Europe/Berlin"));
    }
}
