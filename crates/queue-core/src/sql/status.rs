//! The status store of every SQL backend, written once over the statements each backend
//! provides ([`StatusBackend`]): folding a batch, keeping failed attempts, pruning in
//! slices, and decoding rows into records.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::error::Result;
use crate::history::{Attempt, JobFilter, RawAttempt, StateCount};
use crate::registry::{WorkerInfo, GONE_AFTER};
use crate::status::{
    failed_attempts, fold_updates, prune_in_slices, JobStatus, RawStatus, StatusStore,
    StatusUpdate, Throughput,
};
use crate::time_units::micros;

/// A batch of status updates, folded: each id at most once among `creates` and once
/// among `changes`, both sorted by id.
#[derive(Debug, Clone, Copy)]
pub struct StatusBatch<'a> {
    /// Records to create where the id is new (`pending` on publish).
    pub creates: &'a [StatusUpdate],
    /// Changes, each applied where it [`supersedes`](crate::status::supersedes) the
    /// record.
    pub changes: &'a [StatusUpdate],
    /// Endings of failed attempts, kept among the job's attempts.
    pub tries: &'a [StatusUpdate],
}

/// Which records a read selects.
#[derive(Debug, Clone, Copy)]
pub enum StatusQuery<'a> {
    /// The record of one id.
    Get(Uuid),
    /// The most recently changed records, newest first.
    Recent(i64),
    /// Records that match a filter, the most recently changed first.
    List(&'a JobFilter),
}

/// Which table a prune slice deletes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusTable {
    /// The records (those final longer than the age ago).
    Records,
    /// The failed attempts (those ended longer than the age ago).
    Tries,
}

/// Jobs of one queue in one state, as counted.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct CountRow {
    pub queue: String,
    pub state: String,
    pub n: i64,
}

/// Finished jobs of one queue in one bucket (its start in microseconds).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct BucketRow {
    pub queue: String,
    pub at_us: i64,
    pub completed: i64,
    pub failed: i64,
}

/// A worker's row (times in microseconds since the epoch).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub queue: String,
    pub concurrency: i64,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub jobs_done: i64,
}

/// What a SQL backend's status store provides: its statements, run its own way
/// (SQLite's single writer, PostgreSQL's `NOTIFY` of each change).
#[async_trait]
pub trait StatusBackend: Send + Sync + fmt::Debug + 'static {
    /// Writes a folded batch; empty parts are skipped.
    async fn write(&self, batch: StatusBatch<'_>) -> Result<()>;

    /// Sets `failed` and `dead` records of `ids` back to `pending` and forgets their
    /// attempts; how many it reset.
    async fn reset_rows(&self, ids: &[Uuid]) -> Result<u64>;

    /// The selected records, undecoded.
    async fn status_rows(&self, query: StatusQuery<'_>) -> Result<Vec<RawStatus>>;

    /// The failed attempts of `id`, oldest first, undecoded.
    async fn attempt_rows(&self, id: Uuid) -> Result<Vec<RawAttempt>>;

    /// Jobs per queue and state.
    async fn count_rows(&self) -> Result<Vec<CountRow>>;

    /// Finished jobs per queue in buckets of `bucket_us` over the last `window_us`.
    async fn bucket_rows(&self, window_us: i64, bucket_us: i64) -> Result<Vec<BucketRow>>;

    /// Deletes at most [`PRUNE_SLICE`](crate::status::PRUNE_SLICE) rows of `table` older
    /// than `older_than_us`; how many it deleted.
    async fn prune_slice(&self, table: StatusTable, older_than_us: i64) -> Result<u64>;

    /// Forgets workers silent for `gone_after_us`, then records `worker` as running.
    async fn register(&self, worker: &WorkerInfo, gone_after_us: i64) -> Result<()>;

    /// Renews a worker's heartbeat; `false` when its row is gone.
    async fn heartbeat(&self, id: Uuid, jobs_done: i64) -> Result<bool>;

    /// Deletes a worker's row.
    async fn stopped(&self, id: Uuid) -> Result<()>;

    /// Workers heard from within `gone_after_us`, oldest first.
    async fn worker_rows(&self, gone_after_us: i64) -> Result<Vec<WorkerRow>>;

    /// Ids of records as they change, where the backend announces them.
    fn watch_changes(&self) -> Option<broadcast::Receiver<Uuid>> {
        None
    }

    /// The unique keys of a broker's messages in this store's key table.
    fn broker_keys(&self) -> Option<std::sync::Arc<dyn crate::UniqueKeyStore>> {
        None
    }

    /// The slots and buckets of limits in this store's limit tables.
    fn limit_store(&self) -> Option<std::sync::Arc<dyn crate::LimitStore>> {
        None
    }

    /// Paused queues and cancellation marks in this store's control tables.
    fn control_store(&self) -> Option<std::sync::Arc<dyn crate::Controls>> {
        None
    }

    /// Schedules in this store's schedule table.
    fn schedule_store(&self) -> Option<std::sync::Arc<dyn crate::schedule::ScheduleStore>> {
        None
    }

    /// Checkpoints in this store's checkpoint table.
    fn checkpoint_store(&self) -> Option<std::sync::Arc<dyn crate::checkpoint::CheckpointStore>> {
        None
    }

    /// Job logs in this store's log table.
    fn job_log_store(&self) -> Option<std::sync::Arc<dyn crate::job_log::JobLogStore>> {
        None
    }
}

#[async_trait]
impl<B: StatusBackend> StatusStore for B {
    async fn record(&self, updates: &[StatusUpdate]) -> Result<()> {
        let (creates, changes) = fold_updates(updates);
        let tries = failed_attempts(updates);
        if creates.is_empty() && changes.is_empty() && tries.is_empty() {
            return Ok(());
        }
        self.write(StatusBatch {
            creates: &creates,
            changes: &changes,
            tries: &tries,
        })
        .await
    }

    async fn reset(&self, ids: &[Uuid]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.reset_rows(ids).await
    }

    async fn get(&self, id: Uuid) -> Result<Option<JobStatus>> {
        let rows = self.status_rows(StatusQuery::Get(id)).await?;
        rows.into_iter().next().map(RawStatus::decode).transpose()
    }

    async fn recent(&self, limit: usize) -> Result<Vec<JobStatus>> {
        let limit = crate::time_units::limit(limit);
        decode_all(self.status_rows(StatusQuery::Recent(limit)).await?)
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        let age = micros(older_than);
        prune_in_slices(|| self.prune_slice(StatusTable::Tries, age)).await?;
        prune_in_slices(|| self.prune_slice(StatusTable::Records, age)).await
    }

    async fn throughput(&self, window: Duration, bucket: Duration) -> Result<Vec<Throughput>> {
        let rows = self
            .bucket_rows(micros(window), micros(bucket).max(1))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| Throughput::from_row(r.queue, r.at_us, r.completed, r.failed))
            .collect())
    }

    async fn list(&self, filter: &JobFilter) -> Result<Vec<JobStatus>> {
        decode_all(self.status_rows(StatusQuery::List(filter)).await?)
    }

    async fn counts(&self) -> Result<Vec<StateCount>> {
        let rows = self.count_rows().await?;
        // A state no writer of this crate stores is left out, not an error: the counts
        // of the others still show.
        Ok(rows
            .into_iter()
            .filter_map(|r| StateCount::from_row(r.queue, &r.state, r.n))
            .collect())
    }

    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>> {
        let rows = self.attempt_rows(id).await?;
        rows.into_iter().map(RawAttempt::decode).collect()
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        self.register(worker, micros(GONE_AFTER)).await
    }

    async fn worker_heartbeat(&self, id: Uuid, jobs_done: u64) -> Result<bool> {
        self.heartbeat(id, i64::try_from(jobs_done).unwrap_or(i64::MAX))
            .await
    }

    async fn worker_stopped(&self, id: Uuid) -> Result<()> {
        self.stopped(id).await
    }

    async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let rows = self.worker_rows(micros(GONE_AFTER)).await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                WorkerInfo::from_row(
                    &r.id,
                    r.host,
                    r.pid,
                    r.queue,
                    r.concurrency,
                    r.started_at,
                    r.heartbeat_at,
                    r.jobs_done,
                )
            })
            .collect())
    }

    fn watch(&self) -> Option<broadcast::Receiver<Uuid>> {
        self.watch_changes()
    }

    fn unique_keys(&self) -> Option<std::sync::Arc<dyn crate::UniqueKeyStore>> {
        self.broker_keys()
    }

    fn limits(&self) -> Option<std::sync::Arc<dyn crate::LimitStore>> {
        self.limit_store()
    }

    fn controls(&self) -> Option<std::sync::Arc<dyn crate::Controls>> {
        self.control_store()
    }

    fn schedules(&self) -> Option<std::sync::Arc<dyn crate::schedule::ScheduleStore>> {
        self.schedule_store()
    }

    fn checkpoints(&self) -> Option<std::sync::Arc<dyn crate::checkpoint::CheckpointStore>> {
        self.checkpoint_store()
    }

    fn job_logs(&self) -> Option<std::sync::Arc<dyn crate::job_log::JobLogStore>> {
        self.job_log_store()
    }
}

fn decode_all(rows: Vec<RawStatus>) -> Result<Vec<JobStatus>> {
    rows.into_iter().map(RawStatus::decode).collect()
}
