//! Envelope times written as chrono's serde writes them (RFC 3339, `Z`, as many fraction
//! digits as the time needs), but formatted into a string first: chrono's own serializer
//! hands serde_json its text a character at a time, each through the escaper: a quarter
//! of `Envelope::to_json`'s instructions (`docs/benchmarks.md`, 2026-11-28, late).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

/// Writes `t` as chrono's `Serialize` does.
pub(crate) fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// Writes `t`, or none, as chrono's `Serialize` does (through `serialize_some`, so that
/// formats that mark an option's presence read it back).
pub(crate) fn serialize_option<S: Serializer>(
    t: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_some(&Rfc3339(t)),
        None => s.serialize_none(),
    }
}

/// A time that serializes through [`serialize`].
struct Rfc3339<'a>(&'a DateTime<Utc>);

impl Serialize for Rfc3339<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize(self.0, s)
    }
}

#[cfg(test)]
mod tests {
    use chrono::{NaiveDate, TimeZone};

    use super::*;

    #[derive(serde::Serialize)]
    struct Ours {
        #[serde(serialize_with = "serialize")]
        at: DateTime<Utc>,
        #[serde(serialize_with = "serialize_option")]
        maybe: Option<DateTime<Utc>>,
    }

    #[derive(serde::Serialize)]
    struct Chronos {
        at: DateTime<Utc>,
        maybe: Option<DateTime<Utc>>,
    }

    fn same(at: DateTime<Utc>) {
        for maybe in [None, Some(at)] {
            let ours = serde_json::to_string(&Ours { at, maybe }).expect("serializes");
            let chronos = serde_json::to_string(&Chronos { at, maybe }).expect("serializes");
            assert_eq!(ours, chronos, "{at:?}");
        }
    }

    #[test]
    fn writes_what_chrono_writes() {
        for text in [
            "2026-11-28T10:51:16Z",
            "2026-11-28T10:51:16.5Z",
            "2026-11-28T10:51:16.123Z",
            "2026-11-28T10:51:16.123456Z",
            "2026-11-28T10:51:16.123456789Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
        ] {
            same(text.parse().expect("a valid time"));
        }
        same(Utc::now());
        same(DateTime::<Utc>::MIN_UTC);
        same(DateTime::<Utc>::MAX_UTC);
        for year in [-1, 10_000] {
            same(
                Utc.with_ymd_and_hms(year, 1, 2, 3, 4, 5)
                    .single()
                    .expect("a valid time"),
            );
        }
        let leap = NaiveDate::from_ymd_opt(2016, 12, 31)
            .and_then(|d| d.and_hms_nano_opt(23, 59, 59, 1_500_000_000))
            .expect("a leap second");
        same(Utc.from_utc_datetime(&leap));
    }
}
