//! Where schedules and their cursors are kept: a table beside the jobs in each SQL store
//! (`<table>_sched`; RabbitMQ uses its control store's).

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    /// Its name.
    pub name: String,
    /// Its [`ScheduleSpec`](super::ScheduleSpec), as JSON.
    pub spec: String,
    /// Whether it is paused.
    pub paused: bool,
    /// The cursor: its slots up to this time (µs) were fired or counted missed.
    pub fired_through: i64,
}

/// What storing a schedule did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// It was new; its cursor starts at the time given.
    Added,
    /// Its definition changed; its cursor and pause were kept.
    Changed,
    /// It was stored as it is.
    Unchanged,
}

/// The schedules of one store (see the module documentation). Times are µs since the
/// epoch, by the caller's clock.
#[async_trait]
pub trait ScheduleStore: Send + Sync + fmt::Debug {
    /// Stores `spec` under `name`: a new schedule's cursor starts at `now`, so no slot
    /// before it fires; an existing one keeps its cursor and pause.
    async fn put(&self, name: &str, spec: &str, now: i64) -> Result<PutOutcome>;

    /// Deletes a schedule; whether there was one.
    async fn remove(&self, name: &str) -> Result<bool>;

    /// Pauses or resumes a schedule; whether that changed it. A resumed schedule's
    /// cursor moves to `now`: slots that fell while it was paused do not fire.
    async fn set_paused(&self, name: &str, paused: bool, now: i64) -> Result<bool>;

    /// Every schedule, by name.
    async fn list(&self) -> Result<Vec<StoredSchedule>>;

    /// Moves the cursor of `name` from `from` to `to`; false when another worker moved
    /// it first.
    async fn advance(&self, name: &str, from: i64, to: i64) -> Result<bool>;
}
