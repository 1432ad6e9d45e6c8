//! A schedule written down: the form of a schedules file's `[[schedule]]` table, of the
//! command line, and of the store's `spec` column (JSON, written from a checked
//! [`Schedule`], so the same schedule always reads the same).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Cadence, CatchUp, Schedule};
use crate::error::{Error, Result};

/// `max_runs` when `catch_up = "all"` does not say.
const DEFAULT_MAX_RUNS: u32 = 100;
/// `within` when `catch_up = "all"` does not say.
const DEFAULT_WITHIN: Duration = Duration::from_secs(3600);

/// The fields of [`ScheduleSpec`], as stored.
const KNOWN_FIELDS: [&str; 10] = [
    "name", "cron", "every", "timezone", "queue", "kind", "payload", "catch_up", "max_runs",
    "within",
];

/// A schedule as written (see the module documentation): exactly one of `cron` and
/// `every`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ScheduleSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// An interval such as `15m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// An IANA time zone for `cron`; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    pub queue: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// `skip`, `latest` (the default) or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
    /// With `all`: the most slots one catch-up fires (100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u32>,
    /// With `all`: how far back a missed slot is still fired, such as `1h` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
}

impl ScheduleSpec {
    /// The schedule this describes, checked.
    pub fn to_schedule(&self) -> Result<Schedule> {
        let bad = |what: String| Error::InvalidInput(format!("schedule {}: {what}", self.name));
        let cadence = match (&self.cron, &self.every) {
            (Some(cron), None) => {
                Cadence::cron_in(cron, self.timezone.as_deref().unwrap_or("UTC"))?
            }
            (None, Some(every)) => {
                if self.timezone.is_some() {
                    return Err(bad(
                        "a time zone applies to a cron pattern only; an interval counts from the epoch"
                            .to_owned(),
                    ));
                }
                Cadence::every(duration("every", every).map_err(bad)?)?
            }
            _ => {
                return Err(bad(
                    "give exactly one of cron (a pattern such as \"0 3 * * *\") and every (an interval such as \"15m\")"
                        .to_owned(),
                ))
            }
        };
        let all_only = self.max_runs.is_some() || self.within.is_some();
        let catch_up = match self.catch_up.as_deref().unwrap_or("latest") {
            "skip" if !all_only => CatchUp::Skip,
            "latest" if !all_only => CatchUp::Latest,
            "all" => CatchUp::All {
                max_runs: self.max_runs.unwrap_or(DEFAULT_MAX_RUNS),
                within: match &self.within {
                    Some(w) => duration("within", w).map_err(bad)?,
                    None => DEFAULT_WITHIN,
                },
            },
            "skip" | "latest" => {
                return Err(bad(
                    "max_runs and within go with catch_up = \"all\" only".to_owned()
                ))
            }
            other => {
                return Err(bad(format!(
                    "catch_up {other:?}: accepted are \"skip\", \"latest\" and \"all\""
                )))
            }
        };
        let mut schedule =
            Schedule::new(&self.name, cadence, &self.queue, &self.kind).catch_up(catch_up);
        if let Some(payload) = &self.payload {
            schedule = schedule.payload(payload.clone());
        }
        schedule.validate()?;
        Ok(schedule)
    }

    /// The spec of `schedule`, in its one written form.
    pub fn of(schedule: &Schedule) -> Self {
        let (cron, timezone) = match schedule.cadence.pattern() {
            Some((p, z)) => (Some(p.to_owned()), Some(z.to_owned())),
            None => (None, None),
        };
        let every = schedule
            .cadence
            .interval()
            .map(|d| humantime::format_duration(d).to_string());
        let (catch_up, max_runs, within) = match schedule.catch_up {
            CatchUp::Skip => ("skip", None, None),
            CatchUp::Latest => ("latest", None, None),
            CatchUp::All { max_runs, within } => (
                "all",
                Some(max_runs),
                Some(humantime::format_duration(within).to_string()),
            ),
        };
        ScheduleSpec {
            name: schedule.name.clone(),
            cron,
            every,
            timezone,
            queue: schedule.queue.clone(),
            kind: schedule.kind.clone(),
            payload: Some(schedule.payload.clone()),
            catch_up: Some(catch_up.to_owned()),
            max_runs,
            within,
        }
    }

    /// The JSON the store keeps.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and a JSON value always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the store's JSON. Fields this version does not know are left out: a
    /// newer worker sharing the store may have written them (a file is read strictly).
    pub fn from_json(text: &str) -> Result<Self> {
        let unreadable = |e: serde_json::Error| {
            Error::InvalidInput(format!("a stored schedule is not readable: {e}"))
        };
        let mut value: serde_json::Value = serde_json::from_str(text).map_err(unreadable)?;
        if let Some(fields) = value.as_object_mut() {
            fields.retain(|k, _| KNOWN_FIELDS.contains(&k.as_str()));
        }
        serde_json::from_value(value).map_err(unreadable)
    }
}

fn duration(field: &str, text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!("{field} {text:?}: {e}; accepted are durations such as \"30s\", \"15m\" or \"1h\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ScheduleSpec {
        serde_json::from_value(json).expect("a spec")
    }

    #[test]
    fn a_spec_reads_back_to_the_same_text() {
        let s = spec(serde_json::json!({
            "name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
            "queue": "reports", "kind": "nightly", "payload": {"b": 1, "a": 2},
            "catch_up": "all", "within": "2h"
        }));
        let schedule = s.to_schedule().expect("valid");
        let written = ScheduleSpec::of(&schedule);
        let again = ScheduleSpec::of(&written.to_schedule().expect("valid"));
        assert_eq!(written.to_json(), again.to_json());
        assert_eq!(written.max_runs, Some(100));
    }

    #[test]
    fn a_stored_spec_with_a_newer_field_still_reads() {
        let text = r#"{"name":"a","every":"1m","queue":"q","kind":"k","jitter":"5s"}"#;
        let spec = ScheduleSpec::from_json(text).expect("readable");
        assert_eq!(spec.every.as_deref(), Some("1m"));
    }

    #[test]
    fn mistakes_are_named() {
        for (json, needle) in [
            (
                serde_json::json!({"name": "a", "queue": "q", "kind": "k"}),
                "exactly one of cron",
            ),
            (
                serde_json::json!({"name": "a", "every": "1m", "timezone": "UTC", "queue": "q", "kind": "k"}),
                "cron pattern only",
            ),
            (
                serde_json::json!({"name": "a", "every": "soon", "queue": "q", "kind": "k"}),
                "every \"soon\"",
            ),
            (
                serde_json::json!({"name": "a", "every": "1m", "queue": "q", "kind": "k", "catch_up": "some"}),
                "accepted are \"skip\"",
            ),
            (
                serde_json::json!({"name": "a", "every": "1m", "queue": "q", "kind": "k", "max_runs": 3}),
                "go with catch_up = \"all\"",
            ),
        ] {
            let e = spec(json).to_schedule().expect_err(needle).to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
