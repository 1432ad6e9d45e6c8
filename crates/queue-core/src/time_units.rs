//! Durations and times as the whole microseconds that stores keep, and counts as the
//! integers they bind.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// A duration in whole microseconds, saturating.
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A row count for a `LIMIT` parameter, saturating.
pub fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Microseconds from `from` to `to` (negative when `to` is earlier), saturating.
pub fn micros_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from)
        .num_microseconds()
        .unwrap_or(if to > from { i64::MAX } else { i64::MIN })
}

/// A time from microseconds since the epoch (the earliest time when out of range).
pub fn time_from_micros(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The current time in microseconds since the epoch.
pub(crate) fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}
