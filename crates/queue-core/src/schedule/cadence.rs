//! When a schedule's slots fall: a cron pattern in an IANA time zone, or a fixed
//! interval counted from the Unix epoch (so every worker computes the same slots).
//!
//! Slot times are µs since the epoch. Across a DST change a cron pattern behaves as
//! croner documents (the Open Cron Pattern Specification): a fixed time that falls in
//! the skipped hour runs at the first valid time after the gap that day; a fixed time
//! in a repeated hour runs once, at its first occurrence; wildcard and step fields run
//! at every matching wall-clock time, in both passes of a repeated hour.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use crate::error::{Error, Result};

/// The shortest interval: a schedule fires at most once a second.
const MIN_EVERY: Duration = Duration::from_secs(1);
/// The longest interval: ten years.
const MAX_EVERY: Duration = Duration::from_secs(10 * 366 * 86_400);

/// When a schedule's slots fall (see the module documentation).
#[derive(Clone)]
pub struct Cadence {
    how: How,
}

#[derive(Clone)]
enum How {
    Every(i64),
    Cron {
        pattern: String,
        zone: String,
        cron: Box<Cron>,
        tz: TimeZone,
    },
}

impl Cadence {
    /// A slot every `interval` (1 s at least, whole milliseconds), at the multiples of
    /// it since the Unix epoch: `every(1 h)` fires on the hour, UTC.
    pub fn every(interval: Duration) -> Result<Self> {
        if interval < MIN_EVERY || interval > MAX_EVERY || interval.subsec_nanos() % 1_000_000 != 0
        {
            return Err(Error::InvalidInput(format!(
                "schedule interval {}: accepted are whole milliseconds from 1s to 10 years",
                humantime::format_duration(interval)
            )));
        }
        let us = i64::try_from(interval.as_micros()).map_err(|_| {
            Error::InvalidInput("schedule interval: accepted is 10 years at most".to_owned())
        })?;
        Ok(Cadence {
            how: How::Every(us),
        })
    }

    /// A cron pattern in UTC (see [`Cadence::cron_in`]).
    pub fn cron(pattern: &str) -> Result<Self> {
        Cadence::cron_in(pattern, "UTC")
    }

    /// A cron pattern — five fields (minute hour day-of-month month day-of-week), or six
    /// with seconds first — read on the wall clock of the IANA time zone `zone`
    /// (`Europe/Berlin`), from the system's time zone database.
    pub fn cron_in(pattern: &str, zone: &str) -> Result<Self> {
        let cron = Cron::from_str(pattern).map_err(|e| {
            Error::InvalidInput(format!(
                "cron pattern {pattern:?}: {e}; accepted are 5 fields (minute hour \
                 day-of-month month day-of-week) or 6 with seconds first, such as \
                 \"0 3 * * *\" or \"*/10 * * * * *\""
            ))
        })?;
        let tz = TimeZone::get(zone).map_err(|e| {
            Error::InvalidInput(format!(
                "time zone {zone:?}: {e}; accepted are IANA names such as \"UTC\" or \
                 \"Europe/Berlin\", read from the system's time zone database (the \
                 tzdata package)"
            ))
        })?;
        Ok(Cadence {
            how: How::Cron {
                pattern: pattern.trim().to_owned(),
                zone: zone.to_owned(),
                cron: Box::new(cron),
                tz,
            },
        })
    }

    /// The interval, for an interval cadence.
    pub fn interval(&self) -> Option<Duration> {
        match self.how {
            How::Every(us) => Some(Duration::from_micros(us.unsigned_abs())),
            How::Cron { .. } => None,
        }
    }

    /// The cron pattern and its time zone, for a cron cadence.
    pub fn pattern(&self) -> Option<(&str, &str)> {
        match &self.how {
            How::Every(_) => None,
            How::Cron { pattern, zone, .. } => Some((pattern, zone)),
        }
    }

    /// The first slot after `t` (µs), if any before year 5000.
    pub fn next_after(&self, t: i64) -> Option<i64> {
        match &self.how {
            How::Every(us) => t.div_euclid(*us).checked_add(1)?.checked_mul(*us),
            How::Cron { cron, tz, .. } => {
                let at = zoned(t, tz)?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                micros(&next)
            }
        }
    }

    /// The last slot at or before `t` (µs), if any.
    pub fn at_or_before(&self, t: i64) -> Option<i64> {
        match &self.how {
            How::Every(us) => t.div_euclid(*us).checked_mul(*us),
            How::Cron { cron, tz, .. } => {
                let at = zoned(t, tz)?;
                let prev = cron.find_previous_occurrence(&at, true).ok()?;
                micros(&prev)
            }
        }
    }

    /// The last slot before `t` (µs), if any.
    pub fn before(&self, t: i64) -> Option<i64> {
        self.at_or_before(t.checked_sub(1)?)
    }
}

fn zoned(t: i64, tz: &TimeZone) -> Option<Zoned> {
    Some(Timestamp::from_microsecond(t).ok()?.to_zoned(tz.clone()))
}

fn micros(z: &Zoned) -> Option<i64> {
    Some(z.timestamp().as_microsecond())
}

impl PartialEq for Cadence {
    fn eq(&self, other: &Self) -> bool {
        match (&self.how, &other.how) {
            (How::Every(a), How::Every(b)) => a == b,
            (
                How::Cron {
                    pattern: a,
                    zone: x,
                    ..
                },
                How::Cron {
                    pattern: b,
                    zone: y,
                    ..
                },
            ) => a == b && x == y,
            _ => false,
        }
    }
}

impl fmt::Debug for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.how {
            How::Every(us) => write!(
                f,
                "every {}",
                humantime::format_duration(Duration::from_micros(us.unsigned_abs()))
            ),
            How::Cron { pattern, zone, .. } => write!(f, "cron {pattern:?} in {zone}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(zone: &str, text: &str) -> i64 {
        let tz = TimeZone::get(zone).expect("a zone");
        let dt: jiff::civil::DateTime = text.parse().expect("a civil time");
        let z = tz
            .to_ambiguous_zoned(dt)
            .earlier()
            .expect("a valid wall clock time");
        micros(&z).expect("in range")
    }

    fn wall(zone: &str, t: i64) -> String {
        let tz = TimeZone::get(zone).expect("a zone");
        let z = zoned(t, &tz).expect("in range");
        z.strftime("%Y-%m-%d %H:%M:%S %Z").to_string()
    }

    fn slots(c: &Cadence, zone: &str, from: &str, n: usize) -> Vec<String> {
        let mut t = at(zone, from);
        (0..n)
            .map(|_| {
                t = c.next_after(t).expect("a next slot");
                wall(zone, t)
            })
            .collect()
    }

    #[test]
    fn an_interval_counts_from_the_epoch() {
        let c = Cadence::every(Duration::from_secs(60)).expect("valid");
        assert_eq!(c.next_after(0), Some(60_000_000));
        assert_eq!(c.next_after(59_999_999), Some(60_000_000));
        assert_eq!(c.next_after(60_000_000), Some(120_000_000));
        assert_eq!(c.at_or_before(60_000_000), Some(60_000_000));
        assert_eq!(c.before(60_000_000), Some(0));
        assert!(Cadence::every(Duration::from_millis(500)).is_err());
        assert!(Cadence::every(Duration::from_micros(1_000_500)).is_err());
    }

    #[test]
    fn a_daily_time_in_the_spring_gap_runs_just_after_it_and_once_in_the_autumn() {
        // Europe/Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00
        // CEST falls back to 02:00 CET.
        let c = Cadence::cron_in("30 2 * * *", "Europe/Berlin").expect("valid");
        assert_eq!(
            slots(&c, "Europe/Berlin", "2026-03-27T12:00:00", 3),
            [
                "2026-03-28 02:30:00 CET",
                "2026-03-29 03:00:00 CEST",
                "2026-03-30 02:30:00 CEST"
            ]
        );
        assert_eq!(
            slots(&c, "Europe/Berlin", "2026-10-24T12:00:00", 3),
            [
                "2026-10-25 02:30:00 CEST",
                "2026-10-26 02:30:00 CET",
                "2026-10-27 02:30:00 CET"
            ]
        );
    }

    #[test]
    fn an_hourly_wildcard_runs_in_both_passes_of_the_repeated_hour_and_skips_the_gap() {
        let c = Cadence::cron_in("15 * * * *", "Europe/Berlin").expect("valid");
        assert_eq!(
            slots(&c, "Europe/Berlin", "2026-10-25T01:30:00", 3),
            [
                "2026-10-25 02:15:00 CEST",
                "2026-10-25 02:15:00 CET",
                "2026-10-25 03:15:00 CET"
            ]
        );
        assert_eq!(
            slots(&c, "Europe/Berlin", "2026-03-29T01:30:00", 2),
            ["2026-03-29 03:15:00 CEST", "2026-03-29 04:15:00 CEST"]
        );
    }

    #[test]
    fn bad_patterns_and_zones_are_named() {
        let e = Cadence::cron("61 * * * *")
            .expect_err("minute 61")
            .to_string();
        assert!(e.contains("61 * * * *") && e.contains("5 fields"), "{e}");
        let e = Cadence::cron_in("0 3 * * *", "Mars/Olympus")
            .expect_err("no such zone")
            .to_string();
        assert!(e.contains("Mars/Olympus") && e.contains("IANA"), "{e}");
    }
}
