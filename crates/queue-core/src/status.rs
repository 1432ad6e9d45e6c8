//! Job status and results: an optional store that records, per message id, where the
//! job is (`pending`, `running`, `completed`, `retrying`, `failed`, `dead`), its
//! attempts, the progress its handler reported, its result and its last error; and
//! request/reply on top of it ([`Jobs::publish_and_wait`]).
//!
//! The SQL transports keep it in a table beside their queue table
//! (each SQL transport's `status_store()`; `switchyard::connect_jobs`). Workers write to it in batches, off the hot path
//! ([`crate::worker::Worker::with_status`]); a job is recorded `completed` only once its
//! ack has committed.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::text::bounded;
use crate::transport::Transport;

pub use crate::history::{Attempt, JobFilter, RawAttempt, StateCount};
pub use crate::job_state::JobState;
pub use crate::registry::{worker_label, WorkerInfo, GONE_AFTER, HEARTBEAT_EVERY};

/// What the store knows of one job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// The message id.
    pub id: Uuid,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Where it is.
    pub state: JobState,
    /// Deliveries so far (the attempt running now included).
    pub attempts: u32,
    /// 0–100, as the handler last reported it (100 once completed).
    pub progress: u8,
    /// The handler's short note beside its progress.
    pub progress_message: Option<String>,
    /// The handler's result, once completed.
    pub result: Option<Value>,
    /// The last failure.
    pub last_error: Option<String>,
    /// Counts the changes to this record: a reader that saw version `v` has seen every
    /// change up to it.
    pub version: u64,
    /// When it was first recorded.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it reached a final state.
    pub finished_at: Option<DateTime<Utc>>,
    /// The payload, as recorded when it was published or first run (at most
    /// [`PAYLOAD_KEPT`] bytes of it; a longer one is kept as the text of its start).
    pub payload: Option<Value>,
    /// The worker that runs or ran its latest attempt (`host:pid`).
    pub worker: Option<String>,
    /// When its latest attempt started.
    pub started_at: Option<DateTime<Utc>>,
}

/// A status row as a SQL backend reads it, before decoding (times in microseconds
/// since the Unix epoch).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct RawStatus {
    pub id: String,
    pub queue: String,
    pub kind: String,
    pub state: String,
    pub attempts: i64,
    pub progress: i64,
    pub progress_message: Option<String>,
    pub result: Option<String>,
    pub last_error: Option<String>,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub payload: Option<String>,
    pub worker: Option<String>,
    pub started_at: Option<i64>,
}

impl RawStatus {
    /// Decodes the row; a value no writer of this crate stores is a decode error that
    /// names the column.
    pub fn decode(self) -> Result<JobStatus> {
        let bad = |column: &str, value: &str| {
            Error::Decode(crate::error::DecodeError::new(format!(
                "status row {:?}: column {column} holds {value:?}",
                self.id
            )))
        };
        let time = |column: &str, us: i64| {
            DateTime::from_timestamp_micros(us).ok_or_else(|| bad(column, &us.to_string()))
        };
        Ok(JobStatus {
            id: Uuid::parse_str(&self.id).map_err(|_| bad("id", &self.id))?,
            state: JobState::parse(&self.state).ok_or_else(|| bad("state", &self.state))?,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| bad("attempts", &self.attempts.to_string()))?,
            progress: u8::try_from(self.progress.clamp(0, 100)).unwrap_or(0),
            // A result that is not JSON (written by hand, say) is shown as its text.
            result: self
                .result
                .as_deref()
                .map(|r| serde_json::from_str(r).unwrap_or_else(|_| Value::String(r.to_owned()))),
            version: u64::try_from(self.version)
                .map_err(|_| bad("version", &self.version.to_string()))?,
            created_at: time("created_at", self.created_at)?,
            updated_at: time("updated_at", self.updated_at)?,
            finished_at: self
                .finished_at
                .map(|t| time("finished_at", t))
                .transpose()?,
            started_at: self.started_at.map(|t| time("started_at", t)).transpose()?,
            payload: self
                .payload
                .as_deref()
                .map(|p| serde_json::from_str(p).unwrap_or_else(|_| Value::String(p.to_owned()))),
            worker: self.worker.clone(),
            queue: self.queue.clone(),
            kind: self.kind.clone(),
            progress_message: self.progress_message.clone(),
            last_error: self.last_error.clone(),
        })
    }
}

/// One change to record.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StatusUpdate {
    /// The message id.
    pub id: Uuid,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// The new state.
    pub state: JobState,
    /// The attempt this update belongs to: an update from an older attempt than the one
    /// recorded is ignored (a worker whose lease was lost cannot overwrite its
    /// successor).
    pub attempts: u32,
    /// New progress and note; `None` keeps what is recorded.
    pub progress: Option<(u8, Option<String>)>,
    /// The result (only with `completed`).
    pub result: Option<Value>,
    /// The failure (with `retrying`, `failed`, `dead`); `None` keeps the last one.
    pub error: Option<String>,
    /// Only creates the record: a message published again under a known id, or a
    /// publish that lost the race with its worker, changes nothing.
    pub create_only: bool,
    /// Begins a run of the job: the start of its attempt 1 (a new message under this
    /// id, or its dead letter replayed), or a batch's updates folded onto one. Such an
    /// update may replace a final state; the store counts the runs.
    pub starts_run: bool,
    /// The payload's JSON text (at most [`PAYLOAD_KEPT`] bytes), with `pending` and
    /// `running`; `None` keeps what is recorded.
    pub payload: Option<String>,
    /// The worker (`host:pid`) whose attempt this is; `None` keeps what is recorded.
    pub worker: Option<String>,
    /// Its attempt starts with this update (`running`).
    pub started: bool,
    /// How long its attempt's handler ran, with an ending: the attempt started that
    /// long before the update.
    pub ran_for: Option<Duration>,
}

/// Most bytes of a payload that job status keeps (the queue keeps all of it).
pub const PAYLOAD_KEPT: usize = 16 * 1024;

/// Longest `last_error` kept, in bytes (its end, where the error usually is).
const ERROR_KEPT: usize = crate::text::ERROR_KEPT;
/// Longest progress note kept, in bytes.
const NOTE_KEPT: usize = 200;

impl StatusUpdate {
    /// Whether this begins a run of the job (see [`StatusUpdate::starts_run`]).
    pub fn is_first_start(&self) -> bool {
        self.starts_run
    }

    fn new(envelope: &Envelope, state: JobState, attempts: u32) -> Self {
        StatusUpdate {
            id: envelope.id,
            queue: envelope.queue.to_string(),
            kind: envelope.kind.clone(),
            state,
            attempts,
            progress: None,
            result: None,
            error: None,
            create_only: false,
            starts_run: false,
            payload: None,
            worker: None,
            started: false,
            ran_for: None,
        }
    }

    fn with_payload(mut self, envelope: &Envelope) -> Self {
        let text = envelope.payload.get();
        self.payload = Some(if text.len() <= PAYLOAD_KEPT {
            text.to_owned()
        } else {
            bounded(text, PAYLOAD_KEPT, false)
        });
        self
    }

    /// Names the worker whose attempt this is.
    pub fn by(mut self, worker: &str) -> Self {
        self.worker = Some(worker.to_owned());
        self
    }

    /// Says how long the attempt's handler ran (with an ending).
    pub fn after(mut self, ran_for: Duration) -> Self {
        self.ran_for = Some(ran_for);
        self
    }

    /// Published: `pending`, unless the id is known already (a worker may have
    /// recorded `running` first).
    pub fn published(envelope: &Envelope) -> Self {
        StatusUpdate {
            create_only: true,
            progress: Some((0, None)),
            ..Self::new(envelope, JobState::Pending, envelope.attempts)
        }
        .with_payload(envelope)
    }

    /// Attempt `attempt` started: `running`, progress back to 0.
    pub fn running(envelope: &Envelope, attempt: u32) -> Self {
        StatusUpdate {
            progress: Some((0, None)),
            starts_run: attempt == 1,
            started: true,
            ..Self::new(envelope, JobState::Running, attempt)
        }
        .with_payload(envelope)
    }

    /// The handler reported progress.
    pub fn progress(envelope: &Envelope, attempt: u32, percent: u8, note: Option<String>) -> Self {
        let note = Some(note.map_or_else(String::new, |n| bounded(&n, NOTE_KEPT, false)));
        StatusUpdate {
            progress: Some((percent.min(100), note)),
            ..Self::new(envelope, JobState::Running, attempt)
        }
    }

    /// Acknowledged, with the handler's result.
    pub fn completed(envelope: &Envelope, attempt: u32, result: Option<Value>) -> Self {
        StatusUpdate {
            progress: Some((100, None)),
            result,
            ..Self::new(envelope, JobState::Completed, attempt)
        }
    }

    /// Ended without a result: `retrying`, `failed` or `dead`, or `pending` when it was
    /// handed back unfinished at shutdown.
    pub fn ended(envelope: &Envelope, attempt: u32, state: JobState, error: Option<&str>) -> Self {
        StatusUpdate {
            error: error.map(|e| bounded(e, ERROR_KEPT, true)),
            ..Self::new(envelope, state, attempt)
        }
    }
}

impl StatusUpdate {
    /// The result as JSON text, for binding.
    pub fn result_text(&self) -> Option<String> {
        self.result.as_ref().map(Value::to_string)
    }

    /// The progress percentage, for binding (`None` keeps the recorded one).
    pub fn progress_percent(&self) -> Option<i64> {
        self.progress.as_ref().map(|(p, _)| i64::from(*p))
    }

    /// The progress note, for binding.
    pub fn progress_note(&self) -> Option<&str> {
        self.progress.as_ref().and_then(|(_, n)| n.as_deref())
    }

    /// How long before the write its attempt started, in microseconds, for binding:
    /// 0 for a start, the handler's run time for an ending that knows it; `None` keeps
    /// the recorded start.
    pub fn started_ago_micros(&self) -> Option<i64> {
        match (self.ran_for, self.started) {
            (Some(d), _) => Some(micros(d)),
            (None, true) => Some(0),
            (None, false) => None,
        }
    }

    /// Whether this ends an attempt that did not succeed, which the store keeps among
    /// the job's attempts.
    pub fn ends_a_failed_attempt(&self) -> bool {
        matches!(
            self.state,
            JobState::Retrying | JobState::Failed | JobState::Dead
        )
    }
}

/// The endings of failed attempts in a batch, one per id and attempt (the first), taken
/// before the batch is folded, since folding keeps only the latest change of an id.
pub fn failed_attempts(updates: &[StatusUpdate]) -> Vec<StatusUpdate> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<StatusUpdate> = updates
        .iter()
        .filter(|u| u.ends_a_failed_attempt() && seen.insert((u.id, u.attempts)))
        .cloned()
        .collect();
    out.sort_by_key(|u| (u.id, u.attempts));
    out
}

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

pub use crate::sql::micros;

/// Where job status lives. Implemented by the SQL transports.
#[async_trait]
pub trait StatusStore: Send + Sync + fmt::Debug + 'static {
    /// Records `updates`, in order.
    ///
    /// # Behavior
    /// An update applies only where it [`supersedes`] the record; a `create_only` update
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

    /// The workers heard from within [`GONE_AFTER`],
    /// oldest first; the others are forgotten.
    async fn workers(&self) -> Result<Vec<WorkerInfo>>;

    /// Ids of records as they change, where the store can push them (PostgreSQL's
    /// `LISTEN/NOTIFY`), and the nil id when changes may have been missed (after a
    /// reconnect); `None` means readers poll. A hint: a reader still reads the record,
    /// and still polls now and then in case a notification was lost.
    fn watch(&self) -> Option<broadcast::Receiver<Uuid>> {
        None
    }
}

/// Whether `new` may replace a record in `state` at `attempts`: a later attempt always
/// may; the same attempt only while the job is unfinished (a stray progress report
/// after `completed` or `dead` changes nothing); and the first start of a job that had
/// ended (its dead letter was replayed, or its id published again after it completed:
/// either counts attempts from zero again). Every store applies the same rule in SQL.
pub fn supersedes(state: JobState, attempts: u32, new: &StatusUpdate) -> bool {
    new.attempts > attempts
        || (new.attempts == attempts && !state.is_final())
        || (state.is_final() && new.is_first_start())
}

/// Folds a batch so that each id appears at most once among creations and once among
/// changes (PostgreSQL refuses an upsert that touches a row twice): the first creation
/// of an id wins, and a later change of an id that [`supersedes`] the earlier one
/// overrides it field by field. Both lists are sorted by id, so that two writers'
/// batches lock rows in the same order and cannot deadlock.
pub fn fold_updates(updates: &[StatusUpdate]) -> (Vec<StatusUpdate>, Vec<StatusUpdate>) {
    let mut creates: Vec<StatusUpdate> = Vec::new();
    let mut created: HashMap<Uuid, ()> = HashMap::new();
    let mut changes: Vec<StatusUpdate> = Vec::new();
    let mut at: HashMap<Uuid, usize> = HashMap::new();
    for u in updates {
        if u.create_only {
            if created.insert(u.id, ()).is_none() {
                creates.push(u.clone());
            }
            continue;
        }
        match at.get(&u.id) {
            Some(&i) => {
                let old = &mut changes[i];
                if !supersedes(old.state, old.attempts, u) {
                    continue;
                }
                let progress = u.progress.clone().or_else(|| old.progress.take());
                let error = u.error.clone().or_else(|| old.error.take());
                // A run's start folded with its ending still begins a run.
                let starts_run = old.starts_run || u.starts_run;
                let payload = u.payload.clone().or_else(|| old.payload.take());
                let worker = u.worker.clone().or_else(|| old.worker.take());
                // The same attempt's start folded with its ending: the ending's run time
                // dates the start, or else the start itself (written now).
                let same = u.attempts == old.attempts;
                let started = u.started || (same && old.started);
                let ran_for = u.ran_for.or(if same { old.ran_for } else { None });
                *old = StatusUpdate {
                    progress,
                    error,
                    starts_run,
                    payload,
                    worker,
                    started,
                    ran_for,
                    ..u.clone()
                };
            }
            None => {
                at.insert(u.id, changes.len());
                changes.push(u.clone());
            }
        }
    }
    creates.sort_by_key(|u| u.id);
    changes.sort_by_key(|u| u.id);
    (creates, changes)
}

/// How often a status batch is retried (backing off from 50 ms to 2 s, as acks are)
/// before its updates are written one by one.
const WRITE_RETRIES: u32 = 5;
/// The most updates written at once.
const WRITE_BATCH: usize = 512;
/// How long the writer gathers updates after the first of a batch arrives: a quick
/// job's `running` and `completed` then fold into one row write, which halves the
/// status writes of a busy queue. Followers see changes that much later.
const LINGER: Duration = Duration::from_millis(20);

/// Writes updates in the background, in batches: whatever arrives while one batch is
/// written forms the next.
#[derive(Debug, Clone)]
pub struct StatusWriter {
    tx: mpsc::UnboundedSender<StatusUpdate>,
    /// Names the worker on every update that does not name one.
    worker: Option<Arc<str>>,
}

/// Stops a [`StatusWriter`] once it has written everything sent before.
#[derive(Debug)]
pub struct StatusFlusher {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl StatusFlusher {
    /// Writes what is queued, then stops the writer.
    pub async fn finish(self) {
        self.stop.cancel();
        if self.handle.await.is_err() {
            tracing::error!("the status writer panicked; some status updates were lost");
        }
    }
}

impl StatusWriter {
    /// Starts the writer.
    pub fn spawn(store: Arc<dyn StatusStore>) -> (StatusWriter, StatusFlusher) {
        let (tx, mut rx) = mpsc::unbounded_channel::<StatusUpdate>();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let handle = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(WRITE_BATCH);
            loop {
                tokio::select! {
                    biased;
                    n = rx.recv_many(&mut batch, WRITE_BATCH) => {
                        if n == 0 {
                            return;
                        }
                        let until = tokio::time::Instant::now() + LINGER;
                        while batch.len() < WRITE_BATCH {
                            let room = WRITE_BATCH - batch.len();
                            tokio::select! {
                                biased;
                                n = rx.recv_many(&mut batch, room) => {
                                    if n == 0 {
                                        break;
                                    }
                                }
                                _ = tokio::time::sleep_until(until) => break,
                                _ = stopped.cancelled() => break,
                            }
                        }
                        write(store.as_ref(), &batch).await;
                        batch.clear();
                    }
                    _ = stopped.cancelled() => break,
                }
            }
            while let Ok(update) = rx.try_recv() {
                batch.push(update);
                if batch.len() >= WRITE_BATCH {
                    write(store.as_ref(), &batch).await;
                    batch.clear();
                }
            }
            if !batch.is_empty() {
                write(store.as_ref(), &batch).await;
            }
        });
        (
            StatusWriter { tx, worker: None },
            StatusFlusher { stop, handle },
        )
    }

    /// Queues an update.
    /// Names `worker` (`host:pid`) on every update sent that names none.
    pub fn for_worker(mut self, worker: &str) -> Self {
        self.worker = Some(Arc::from(worker));
        self
    }

    /// Queues an update.
    pub fn send(&self, mut update: StatusUpdate) {
        if update.worker.is_none() {
            update.worker = self.worker.as_deref().map(str::to_owned);
        }
        if self.tx.send(update).is_err() {
            tracing::warn!("the status writer stopped; a status update was dropped");
        }
    }
}

async fn write(store: &dyn StatusStore, batch: &[StatusUpdate]) {
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=WRITE_RETRIES {
        match store.record(batch).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(error = %err, attempt, size = batch.len(), "status write failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    // One update the store refuses (a result over MySQL's packet size, say) must not
    // take the rest of its batch down: write them one by one.
    let mut lost = 0;
    for update in batch {
        if let Err(err) = store.record(std::slice::from_ref(update)).await {
            lost += 1;
            tracing::error!(error = %err, id = %update.id, state = %update.state, "status update dropped; the job ran, its status is stale");
        }
    }
    if lost == 0 {
        tracing::info!(
            size = batch.len(),
            "status batch written one update at a time"
        );
    }
}

/// Polling readers start at this pause and double it up to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(10);
/// The longest pause of a polling reader.
const POLL_MAX: Duration = Duration::from_millis(250);
/// Readers woken by notifications still read this often, in case one was lost.
const WATCH_FALLBACK: Duration = Duration::from_secs(1);

/// Waits until the record of `id` is newer than `after_version`, and returns it; `None`
/// once `deadline` passes first. Woken by the store's notifications where it has them,
/// else by polling with backoff.
pub async fn next_change(
    store: &dyn StatusStore,
    id: Uuid,
    after_version: u64,
    deadline: tokio::time::Instant,
) -> Result<Option<JobStatus>> {
    // Subscribed before reading, so that a change between the read and the wait is seen.
    let mut watch = store.watch();
    let mut pause = POLL_MIN;
    loop {
        if let Some(status) = store.get(id).await? {
            if status.version > after_version {
                return Ok(Some(status));
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        match watch.as_mut() {
            Some(rx) => {
                let until = deadline.min(now + WATCH_FALLBACK);
                loop {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        // The nil id: notifications may have been missed; read.
                        Ok(Ok(changed)) if changed != id && !changed.is_nil() => continue,
                        // Ours, or notifications were dropped (lagged) or stopped: read.
                        Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => break,
                        Ok(Err(broadcast::error::RecvError::Closed)) => {
                            watch = None;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
            None => {
                tokio::time::sleep_until(deadline.min(now + pause)).await;
                pause = (pause * 2).min(POLL_MAX);
            }
        }
    }
}

/// Why [`Jobs::publish_and_wait`] returned no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The job ended without a result: `failed` or `dead`.
    #[error("job {} ended {}: {}", .0.id, .0.state, .0.last_error.as_deref().unwrap_or("no error recorded"))]
    Failed(Box<JobStatus>),
    /// No final state within the timeout; the job may still run. `last` is what was
    /// recorded when the wait gave up.
    #[error("no answer from job {id} within {timeout:?} (last seen: {})", last.as_ref().map_or("nothing recorded", |s| s.state.as_str()))]
    TimedOut {
        /// The job.
        id: Uuid,
        /// How long the wait lasted.
        timeout: Duration,
        /// The record when it gave up.
        last: Option<Box<JobStatus>>,
    },
    /// Publishing or reading the status failed.
    #[error(transparent)]
    Queue(#[from] Error),
}

/// Publishes through a transport and keeps each job's status: what an application uses
/// to enqueue jobs it wants to follow, or wait for.
#[derive(Debug, Clone)]
pub struct Jobs {
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn StatusStore>>,
}

impl Jobs {
    /// Over `transport`, recording status in `store` (`None`: publishing only).
    pub fn new(transport: Arc<dyn Transport>, store: Option<Arc<dyn StatusStore>>) -> Self {
        Jobs { transport, store }
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The status store, if any.
    pub fn store(&self) -> Option<&Arc<dyn StatusStore>> {
        self.store.as_ref()
    }

    fn require_store(&self) -> Result<&Arc<dyn StatusStore>> {
        self.store.as_ref().ok_or_else(|| {
            Error::NotSupported(
                "job status is off: it needs a SQL store (DATABASE_URL) and QUEUE_STATUS=on".into(),
            )
        })
    }

    /// Publishes one message, recorded `pending`.
    pub async fn publish(&self, envelope: Envelope) -> Result<()> {
        self.publish_batch(vec![envelope]).await
    }

    /// Publishes messages, then records them `pending`. A worker quick enough to
    /// record `running` first keeps it (`pending` only ever creates a record). A failed
    /// status write is logged, not returned: the messages are stored, and a caller told
    /// otherwise would publish them again.
    pub async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<()> {
        let updates: Vec<StatusUpdate> = match &self.store {
            Some(_) => envelopes.iter().map(StatusUpdate::published).collect(),
            None => Vec::new(),
        };
        let counts: Vec<(String, String)> = envelopes
            .iter()
            .map(|e| (e.queue.to_string(), e.kind.clone()))
            .collect();
        self.transport.publish_batch(envelopes).await?;
        for (queue, kind) in counts {
            crate::metrics::published(&queue, &kind);
        }
        if let Some(store) = &self.store {
            if let Err(err) = store.record(&updates).await {
                tracing::warn!(error = %err, count = updates.len(), "published, but their pending status was not recorded");
            }
        }
        Ok(())
    }

    /// Replays the selected dead letters (see
    /// [`DeadLetters::dead_replay`](crate::DeadLetters::dead_replay)); a job replayed by
    /// id is `pending` again in the status store (its status said `dead`). A failed
    /// status write is logged: the message is back on its queue either way.
    pub async fn replay_dead(
        &self,
        queue: Option<&crate::names::QueueName>,
        selection: &crate::DeadSelection,
    ) -> Result<u64> {
        let replayed = self.transport.dead_replay(queue, selection).await?;
        if let (crate::DeadSelection::Id(id), Some(store), true) =
            (selection, &self.store, replayed > 0)
        {
            if let Ok(id) = Uuid::parse_str(id) {
                if let Err(err) = store.reset(&[id]).await {
                    tracing::warn!(error = %err, %id, "replayed, but its status still says dead");
                }
            }
        }
        Ok(replayed)
    }

    /// The status of `id`.
    pub async fn status(&self, id: Uuid) -> Result<Option<JobStatus>> {
        self.require_store()?.get(id).await
    }

    /// Publishes `envelope` and waits up to `timeout` for its job to end: the handler's
    /// result (`null` when it returned none), or [`WaitError::Failed`] once it failed
    /// or died, or [`WaitError::TimedOut`]. Retries in between are waited through. On
    /// PostgreSQL the wait is woken by `LISTEN/NOTIFY`; elsewhere it polls, from 10 ms
    /// backing off to 250 ms.
    pub async fn publish_and_wait(
        &self,
        envelope: Envelope,
        timeout: Duration,
    ) -> std::result::Result<Value, WaitError> {
        let store = self.require_store()?.clone();
        let id = envelope.id;
        // An id used before (a deterministic request id) may have an old answer on
        // record: only what changes after this publish is an answer to it.
        let mut version = store.get(id).await?.map_or(0, |s| s.version);
        self.publish(envelope).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            match next_change(store.as_ref(), id, version, deadline).await? {
                None => {
                    return Err(WaitError::TimedOut {
                        id,
                        timeout,
                        last: last.map(Box::new),
                    })
                }
                Some(status) => {
                    version = status.version;
                    match status.state {
                        JobState::Completed => return Ok(status.result.unwrap_or(Value::Null)),
                        JobState::Failed | JobState::Dead => {
                            return Err(WaitError::Failed(Box::new(status)))
                        }
                        _ => last = Some(status),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Envelope {
        Envelope::builder("q", "k").build().expect("an envelope")
    }

    #[test]
    fn states_round_trip_their_names() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("done"), None);
        assert!(JobState::Dead.is_final() && !JobState::Retrying.is_final());
    }

    #[test]
    fn folding_keeps_one_change_per_id_and_drops_older_attempts() {
        let e = env();
        let updates = vec![
            StatusUpdate::published(&e),
            StatusUpdate::published(&e),
            StatusUpdate::running(&e, 2),
            StatusUpdate::progress(&e, 2, 40, Some("half".into())),
            StatusUpdate::ended(&e, 1, JobState::Retrying, Some("stale")),
            StatusUpdate::ended(&e, 2, JobState::Retrying, Some("boom")),
        ];
        let (creates, changes) = fold_updates(&updates);
        assert_eq!(creates.len(), 1);
        assert_eq!(changes.len(), 1);
        let c = &changes[0];
        assert_eq!(c.state, JobState::Retrying);
        assert_eq!(c.attempts, 2);
        assert_eq!(c.progress, Some((40, Some("half".into()))));
        assert_eq!(c.error.as_deref(), Some("boom"));
    }
}
