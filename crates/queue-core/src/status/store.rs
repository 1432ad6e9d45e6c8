//! Where job status lives: the store's contract, and what its maintenance shares.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::record::JobStatus;
use super::update::StatusUpdate;
use crate::error::Result;
use crate::history::{Attempt, JobFilter, StateCount};
use crate::registry::WorkerInfo;

/// Finished jobs of one queue in one time bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Throughput {
    /// The queue.
    pub queue: String,
    /// The bucket's start.
    pub at: DateTime<Utc>,
    /// Jobs completed in it.
    pub completed: u64,
    /// Jobs that failed or died in it.
    pub failed: u64,
}

impl Throughput {
    /// A bucket as SQL reads it: its start in microseconds since the epoch, counts as
    /// integers (a value out of range reads as the epoch, or 0).
    pub fn from_row(queue: String, at_micros: i64, completed: i64, failed: i64) -> Self {
        Throughput {
            queue,
            at: DateTime::from_timestamp_micros(at_micros).unwrap_or_default(),
            completed: u64::try_from(completed).unwrap_or(0),
            failed: u64::try_from(failed).unwrap_or(0),
        }
    }
}

/// The most rows one statement of a prune deletes (the stores' `LIMIT`), so that other
/// writers get the table in between.
pub const PRUNE_SLICE: u64 = 10_000;

/// Runs `delete_slice`, which deletes at most [`PRUNE_SLICE`] rows, until a slice comes
/// back short; returns how many rows it deleted in all.
pub async fn prune_in_slices<F, Fut>(mut delete_slice: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut total = 0;
    loop {
        let n = delete_slice().await?;
        total += n;
        if n < PRUNE_SLICE {
            return Ok(total);
        }
    }
}

/// Where job status lives. Implemented by the SQL transports.
#[async_trait]
pub trait StatusStore: Send + Sync + fmt::Debug + 'static {
    /// Records `updates`, in order.
    ///
    /// # Behavior
    /// An update applies only where it [`supersedes`](super::supersedes) the record; a `create_only` update
    /// of a known id is ignored. Each applied update bumps the record's `version`; a
    /// final state sets `finished_at`, any other clears it.
    async fn record(&self, updates: &[StatusUpdate]) -> Result<()>;

    /// Sets jobs that `failed` or are `dead` back to `pending`, attempts 0 (their dead
    /// letters were replayed). Returns how many it reset.
    async fn reset(&self, ids: &[Uuid]) -> Result<u64>;

    /// The record of `id`.
    async fn get(&self, id: Uuid) -> Result<Option<JobStatus>>;

    /// The most recently changed records, newest first.
    async fn recent(&self, limit: usize) -> Result<Vec<JobStatus>>;

    /// Deletes records that reached a final state longer than `older_than` ago.
    async fn prune(&self, older_than: Duration) -> Result<u64>;

    /// Jobs finished per queue in buckets of `bucket` over the last `window`.
    async fn throughput(&self, window: Duration, bucket: Duration) -> Result<Vec<Throughput>>;

    /// Jobs that match `filter`, the most recently changed first.
    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobStatus>>;

    /// How many jobs each queue has in each state (states without jobs left out).
    async fn counts(&self) -> Result<Vec<StateCount>>;

    /// The attempts of `id` that ended without success, oldest first.
    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>>;

    /// Records a worker as running (its times are the store's).
    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()>;

    /// A worker's heartbeat, with the jobs it has finished; `false` when the store had
    /// forgotten it (it was silent too long), so that it registers again.
    async fn worker_heartbeat(&self, id: Uuid, jobs_done: u64) -> Result<bool>;

    /// A worker stopped.
    async fn worker_stopped(&self, id: Uuid) -> Result<()>;

    /// The workers heard from within [`GONE_AFTER`](crate::status::GONE_AFTER),
    /// oldest first; the others are forgotten.
    async fn workers(&self) -> Result<Vec<WorkerInfo>>;

    /// Ids of records as they change, where the store can push them (PostgreSQL's
    /// `LISTEN/NOTIFY`), and the nil id when changes may have been missed (after a
    /// reconnect); `None` means readers poll. A hint: a reader still reads the record,
    /// and still polls now and then in case a notification was lost.
    fn watch(&self) -> Option<broadcast::Receiver<Uuid>> {
        None
    }

    /// The unique keys of a broker's messages, kept in this store when it can (the SQL
    /// stores; see [`UniqueKeyStore`](crate::UniqueKeyStore)).
    fn unique_keys(&self) -> Option<std::sync::Arc<dyn crate::UniqueKeyStore>> {
        None
    }

    /// The slots and buckets of workers' limits, kept in this store when it can (the
    /// SQL stores; see [`LimitStore`](crate::LimitStore)).
    fn limits(&self) -> Option<std::sync::Arc<dyn crate::LimitStore>> {
        None
    }

    /// Paused queues and cancellation marks, kept in this store when it can (the SQL
    /// stores; see [`Controls`](crate::Controls)).
    fn controls(&self) -> Option<std::sync::Arc<dyn crate::Controls>> {
        None
    }

    /// Schedules and their cursors, kept in this store when it can (the SQL stores; see
    /// [`ScheduleStore`](crate::schedule::ScheduleStore)).
    fn schedules(&self) -> Option<std::sync::Arc<dyn crate::schedule::ScheduleStore>> {
        None
    }

    /// Job checkpoints, kept in this store when it can (the SQL stores; see
    /// [`crate::checkpoint`]).
    fn checkpoints(&self) -> Option<std::sync::Arc<dyn crate::checkpoint::CheckpointStore>> {
        None
    }

    /// Job logs, kept in this store when it can (the SQL stores; see
    /// [`crate::job_log`]).
    fn job_logs(&self) -> Option<std::sync::Arc<dyn crate::job_log::JobLogStore>> {
        None
    }
}
