//! Durable schedules: periodic jobs that neither miss nor double, with no leader.
//!
//! A schedule names a cadence (a cron pattern in a time zone, or an interval), the job
//! it publishes (queue, kind, payload) and what to do about slots missed while no
//! worker ran ([`CatchUp`]). Schedules live in the SQL store beside the jobs (for
//! RabbitMQ, its control store), with a cursor: the last slot handled.
//!
//! Any worker may fire due slots ([`Scheduler`]). Exactly one job per slot comes from
//! the slot itself, not from an election: the job carries the unique key
//! `schedule:<name>@<slot>`, held until well after the job is done, and on the SQL
//! backends its id is derived from (schedule, slot time), so a slot published twice,
//! by any number of workers, stores one job. (On RabbitMQ the key is recorded in the
//! control store before the send, and each publish has an id of its own: the broker
//! would take a second publish of one id for a retry and send it again.) The cursor then moves by compare-and-set; a worker that dies between the two
//! leaves the slot to the next, whose publish is a duplicate.

mod cadence;
mod maintenance;
mod plan;
mod scheduler;
mod spec;
mod store;

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use cadence::Cadence;
pub use maintenance::{prune, PRUNE, RESERVED_KIND_PREFIX};
pub use scheduler::{list_schedules, FireReport, ScheduleInfo, Scheduler};
pub use spec::ScheduleSpec;
pub use store::{PutOutcome, ScheduleStore, StoredSchedule};

use crate::envelope::{Envelope, EnvelopeBuilder};
use crate::error::{Error, Result};
use crate::unique::Unique;

/// Bytes in a schedule's name.
pub const MAX_SCHEDULE_NAME_LEN: usize = 100;

/// The most missed slots one catch-up fires.
pub const MAX_RUNS: u32 = 10_000;
/// The farthest back a catch-up looks.
const MAX_WITHIN: Duration = Duration::from_secs(366 * 86_400);

/// The header that names the schedule a job came from.
pub const SCHEDULE_HEADER: &str = "switchyard-schedule";
/// The header that holds the slot a job was fired for (RFC 3339, UTC; `trigger` for a
/// job of `schedule trigger`).
pub const SLOT_HEADER: &str = "switchyard-slot";

/// The namespace of slot job ids (UUID v5 of "name@slot µs").
const SLOT_NAMESPACE: Uuid = Uuid::from_u128(0x5c4e_d01e_5107_4a11_9b0b_2f6c_a1d3_0e77);

/// What a schedule does about slots that passed while no worker could fire them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Fire a slot only while it is on time (before its next slot, a minute at most);
    /// later ones are counted missed.
    Skip,
    /// Fire the latest missed slot once; the older ones are counted missed. The default.
    #[default]
    Latest,
    /// Fire every missed slot, oldest first: at most `max_runs`, and only those within
    /// `within` of now.
    All {
        /// The most slots one catch-up fires.
        max_runs: u32,
        /// How far back a missed slot is still fired.
        within: Duration,
    },
}

/// A periodic job (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Schedule {
    /// 1 to 100 bytes of ASCII letters, digits, `.`, `_`, `-` and `:`.
    pub name: String,
    /// When its slots fall.
    pub cadence: Cadence,
    /// The queue its jobs go to.
    pub queue: String,
    /// Their kind.
    pub kind: String,
    /// Their payload.
    pub payload: serde_json::Value,
    /// What it does about missed slots.
    pub catch_up: CatchUp,
}

impl Schedule {
    /// A schedule `name` that publishes a job of `kind` with an empty object as payload
    /// to `queue` at each slot of `cadence`, catching up the latest missed slot.
    pub fn new(
        name: impl Into<String>,
        cadence: Cadence,
        queue: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        Schedule {
            name: name.into(),
            cadence,
            queue: queue.into(),
            kind: kind.into(),
            payload: serde_json::Value::Object(serde_json::Map::new()),
            catch_up: CatchUp::default(),
        }
    }

    /// Sets the jobs' payload.
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }

    /// Sets the catch-up policy.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Checks the name, and that its jobs would be valid messages.
    pub fn validate(&self) -> Result<()> {
        check_name(&self.name)?;
        if let CatchUp::All { max_runs, within } = self.catch_up {
            if !(1..=MAX_RUNS).contains(&max_runs) || within > MAX_WITHIN {
                return Err(Error::InvalidInput(format!(
                    "schedule {}: max_runs {max_runs}, within {}: accepted are max_runs from 1 \
                     to {MAX_RUNS} and within up to 366 days",
                    self.name,
                    humantime::format_duration(within)
                )));
            }
        }
        self.task()?;
        self.job_builder().build().map(|_| ())
    }

    fn job_builder(&self) -> EnvelopeBuilder {
        Envelope::builder(self.queue.clone(), self.kind.clone())
            .payload(&self.payload)
            .header(SCHEDULE_HEADER, self.name.clone())
    }

    /// The job of the slot at `slot` (µs), under the slot's unique key. Its id is the
    /// slot's own ([`slot_id`]) with `derived_id`, for a transport whose publish of a
    /// stored id is a no-op; otherwise a new one, since a broker's publish of the same
    /// id again is taken for a retry and sent again, while another id meets the key.
    pub fn slot_job(&self, slot: i64, derived_id: bool) -> Result<Envelope> {
        let at = DateTime::<Utc>::from_timestamp_micros(slot).ok_or_else(|| {
            Error::InvalidInput(format!(
                "schedule {}: slot {slot} µs is out of range",
                self.name
            ))
        })?;
        let builder = self.job_builder();
        let builder = if derived_id {
            builder.id(slot_id(&self.name, slot))
        } else {
            builder
        };
        builder
            .header(
                SLOT_HEADER,
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            )
            .unique(
                Unique::new(format!("schedule:{}@{slot}", self.name))
                    .until_done_for(plan::key_hold(&self.cadence, &self.catch_up, slot)),
            )
            .build()
    }

    /// A job outside the slots, now (`schedule trigger`): an id of its own.
    pub fn triggered_job(&self) -> Result<Envelope> {
        self.job_builder().header(SLOT_HEADER, "trigger").build()
    }
}

/// The id of the job of `name`'s slot at `slot` µs: the same in every worker.
pub fn slot_id(name: &str, slot: i64) -> Uuid {
    Uuid::new_v5(&SLOT_NAMESPACE, format!("{name}@{slot}").as_bytes())
}

/// Checks a schedule name.
pub fn check_name(name: &str) -> Result<()> {
    if crate::names::is_name(name, MAX_SCHEDULE_NAME_LEN) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "schedule name {name:?}: accepted are 1 to {MAX_SCHEDULE_NAME_LEN} ASCII \
             letters, digits, '.', '_', '-' and ':'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_job_is_the_same_in_every_worker_and_holds_its_slot() {
        let s = Schedule::new(
            "nightly",
            Cadence::every(Duration::from_secs(60)).expect("valid"),
            "reports",
            "nightly",
        );
        let a = s.slot_job(120_000_000, true).expect("valid");
        let b = s.slot_job(120_000_000, true).expect("valid");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, s.slot_job(180_000_000, true).expect("valid").id);
        let c = s.slot_job(120_000_000, false).expect("valid");
        assert_ne!(a.id, c.id);
        assert_eq!(a.unique, c.unique);
        let unique = a.unique.as_ref().expect("a unique key");
        assert_eq!(unique.key, "schedule:nightly@120000000");
        assert_eq!(
            a.headers.get(SLOT_HEADER).map(String::as_str),
            Some("1970-01-01T00:02:00.000000Z")
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("reports.nightly-eu:1").is_ok());
        for bad in ["", "with space", "é", &"x".repeat(101)] {
            let e = check_name(bad).expect_err(bad).to_string();
            assert!(e.contains("accepted"), "{e}");
        }
    }
}
