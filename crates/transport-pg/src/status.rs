//! Job status and results in `<table>_status` (see `queue_core::status`), with every
//! change announced by `NOTIFY` so that followers wake at once.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use queue_core::sql::{
    micros, BucketRow, CountRow, StatusBackend, StatusBatch, StatusQuery, StatusTable, WorkerRow,
};
use queue_core::status::{JobState, RawAttempt, RawStatus, StatusUpdate, WorkerInfo};
use queue_core::Result;
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{PgPool, Row};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::broker_keys::PgBrokerKeys;
use crate::error::SqlxResultExt;
use crate::limits::PgLimits;
use crate::listener;
use crate::runner::PgRunner;
use crate::sql::specialise;
use crate::unique_sql::KeySql;
use queue_core::sql::checkpoints::{CheckpointStatements, SqlCheckpoints};
use queue_core::sql::controls::{ControlStatements, SqlControls};
use queue_core::sql::job_logs::{JobLogStatements, SqlJobLogs};
use queue_core::sql::limits::Dialect as SqlDialect;
use queue_core::sql::schedules::{ScheduleStatements, SqlSchedules};

/// Counts the ids a statement returned and announces them, at most 200 per
/// notification (a payload holds under 8,000 bytes).
const NOTIFY_RETURNED: &str = "
SELECT (SELECT count(*) FROM changed) AS changed,
       (SELECT count(pg_notify($1, ids)) FROM (
            SELECT string_agg(id, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk FROM changed) c
             GROUP BY chunk) n) AS notified";

const CREATE: &str = "
WITH changed AS (
    INSERT INTO \"switchyard_jobs_status\" (id, queue, kind, state, attempts, progress, payload)
    SELECT u.id, u.queue, u.kind, u.state, u.attempts, 0, u.payload
      FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[])
           AS u(id, queue, kind, state, attempts, payload)
    ON CONFLICT (id) DO NOTHING
    RETURNING id)
{NOTIFY_RETURNED}";

/// The rule of `queue_core::status::supersedes`: a later attempt; the same attempt while
/// unfinished; or the first start of a job that had ended (replayed, or its id
/// published again).
const CHANGE: &str = "
WITH changed AS (
    INSERT INTO \"switchyard_jobs_status\" AS s
        (id, queue, kind, state, attempts, progress, progress_message, result, last_error,
         runs, finished_at, payload, worker, started_at)
    SELECT u.id, u.queue, u.kind, u.state, u.attempts, u.progress, u.note, u.result,
           u.error, u.runs, CASE WHEN u.final THEN now() END, u.payload, u.worker,
           now() - u.started_ago * interval '1 microsecond'
      FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::smallint[],
                  $8::text[], $9::text[], $10::text[], $11::bool[], $12::int[], $13::text[],
                  $14::text[], $15::bigint[])
           AS u(id, queue, kind, state, attempts, progress, note, result, error, final, runs,
                payload, worker, started_ago)
    ON CONFLICT (id) DO UPDATE SET
        state = excluded.state,
        attempts = excluded.attempts,
        progress = coalesce(excluded.progress, s.progress),
        progress_message = CASE WHEN excluded.progress IS NULL THEN s.progress_message
                                ELSE excluded.progress_message END,
        result = excluded.result,
        last_error = coalesce(excluded.last_error, s.last_error),
        runs = s.runs + excluded.runs,
        version = s.version + 1,
        updated_at = now(),
        finished_at = excluded.finished_at,
        payload = coalesce(excluded.payload, s.payload),
        worker = coalesce(excluded.worker, s.worker),
        started_at = coalesce(excluded.started_at, s.started_at)
    WHERE excluded.attempts > s.attempts
       OR (excluded.attempts = s.attempts AND s.state NOT IN ('completed', 'failed', 'dead', 'cancelled'))
       OR (excluded.runs = 1 AND s.state IN ('completed', 'failed', 'dead', 'cancelled'))
    RETURNING id)
{NOTIFY_RETURNED}";

const RESET: &str = "
WITH changed AS (
    UPDATE \"switchyard_jobs_status\"
       SET state = 'pending', attempts = 0, progress = 0, progress_message = NULL,
           result = NULL, finished_at = NULL, worker = NULL, started_at = NULL, version = version + 1, updated_at = now()
     WHERE id = ANY($2::text[]) AND state IN ('failed', 'dead')
    RETURNING id)
{NOTIFY_RETURNED}";

const COLUMNS: &str = "id, queue, kind, state, attempts::bigint AS attempts, \
    coalesce(progress, 0)::bigint AS progress, progress_message, result, last_error, version, \
    (extract(epoch FROM created_at) * 1000000)::bigint AS created_at, \
    (extract(epoch FROM updated_at) * 1000000)::bigint AS updated_at, \
    (extract(epoch FROM finished_at) * 1000000)::bigint AS finished_at, \
    payload, worker, (extract(epoch FROM started_at) * 1000000)::bigint AS started_at";

/// Failed attempts, one per id and attempt; the latest word on an attempt wins (a job
/// published again under its id counts attempts anew).
const TRIES: &str = "
INSERT INTO \"switchyard_jobs_tries\" AS t (id, attempt, state, error, worker, started_at)
SELECT u.id, u.attempt, u.state, u.error, u.worker,
       now() - u.started_ago * interval '1 microsecond'
  FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::bigint[])
       AS u(id, attempt, state, error, worker, started_ago)
ON CONFLICT (id, attempt) DO UPDATE SET
    state = excluded.state, error = excluded.error, worker = excluded.worker,
    started_at = excluded.started_at, ended_at = now()";

/// A replayed job starts over: its old attempts go with its reset.
const FORGET_TRIES: &str = "
DELETE FROM \"switchyard_jobs_tries\" t WHERE t.id = ANY($1::text[])
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs_status\" s WHERE s.id = t.id AND s.state = 'pending')";

const LIST: &str = "
SELECT {COLUMNS} FROM \"switchyard_jobs_status\"
 WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2)
   AND ($3::text IS NULL OR id LIKE $3 OR kind = $4)
 ORDER BY updated_at DESC LIMIT $5 OFFSET $6";

const COUNTS: &str = "
SELECT queue, state, count(*) AS n FROM \"switchyard_jobs_status\" GROUP BY queue, state";

const ATTEMPTS: &str = "
SELECT id, attempt::bigint AS attempt, state, error, worker,
       (extract(epoch FROM started_at) * 1000000)::bigint AS started_at,
       (extract(epoch FROM ended_at) * 1000000)::bigint AS ended_at
  FROM \"switchyard_jobs_tries\" WHERE id = $1 ORDER BY attempt";

const PRUNE_TRIES: &str = "
DELETE FROM \"switchyard_jobs_tries\" WHERE ctid IN (
    SELECT ctid FROM \"switchyard_jobs_tries\"
     WHERE ended_at < now() - $1 * interval '1 microsecond' LIMIT 10000)";

/// Registering forgets workers gone silent.
const FORGET_GONE: &str = "
DELETE FROM \"switchyard_jobs_procs\" WHERE heartbeat_at < now() - $1 * interval '1 microsecond'";

const REGISTER: &str = "
INSERT INTO \"switchyard_jobs_procs\" (id, host, pid, queue, concurrency)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()";

const HEARTBEAT: &str = "
UPDATE \"switchyard_jobs_procs\" SET heartbeat_at = now(), jobs_done = $2 WHERE id = $1";

const STOPPED: &str = "DELETE FROM \"switchyard_jobs_procs\" WHERE id = $1";

const WORKERS: &str = "
SELECT id, host, pid::bigint AS pid, queue, concurrency::bigint AS concurrency,
       (extract(epoch FROM started_at) * 1000000)::bigint AS started_at,
       (extract(epoch FROM heartbeat_at) * 1000000)::bigint AS heartbeat_at, jobs_done
  FROM \"switchyard_jobs_procs\"
 WHERE heartbeat_at >= now() - $1 * interval '1 microsecond' ORDER BY started_at, id";

const PRUNE: &str = "
DELETE FROM \"switchyard_jobs_status\" WHERE id IN (
    SELECT id FROM \"switchyard_jobs_status\"
     WHERE finished_at < now() - $1 * interval '1 microsecond' LIMIT 10000)";

const THROUGHPUT: &str = "
SELECT queue,
       (floor(extract(epoch FROM finished_at) * 1000000 / $2) * $2)::bigint AS bucket,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state IN ('failed', 'dead')) AS failed
  FROM \"switchyard_jobs_status\"
 WHERE finished_at >= now() - $1 * interval '1 microsecond'
 GROUP BY 1, 2 ORDER BY 2, 1";

/// The status store of a PostgreSQL transport.
#[derive(Debug)]
pub struct PgStatusStore {
    pool: PgPool,
    connect: PgConnectOptions,
    channel: String,
    stop: CancellationToken,
    /// The listener's channel and task, once a follower asked.
    changes: Mutex<Option<(broadcast::Sender<Uuid>, tokio::task::JoinHandle<()>)>>,
    create: String,
    change: String,
    reset: String,
    get: String,
    recent: String,
    prune: String,
    throughput: String,
    tries: String,
    forget_tries: String,
    list: String,
    counts: String,
    attempts: String,
    prune_tries: String,
    forget_gone: String,
    register: String,
    heartbeat: String,
    stopped: String,
    workers: String,
    /// The key table's statements, for the broker key store.
    keys: Arc<KeySql>,
    /// The limit tables.
    limits: Arc<PgLimits>,
    /// The control tables.
    controls: Arc<SqlControls<PgRunner>>,
    /// The schedule table.
    schedules: Arc<SqlSchedules<PgRunner>>,
    /// The checkpoint table.
    checkpoints: Arc<SqlCheckpoints<PgRunner>>,
    /// The job log table.
    job_logs: Arc<SqlJobLogs<PgRunner>>,
}

impl PgStatusStore {
    pub(crate) fn new(
        pool: PgPool,
        connect: PgConnectOptions,
        schema: Option<&str>,
        table: &str,
        stop: CancellationToken,
    ) -> Self {
        let s = |sql: &str| {
            specialise(
                &sql.replace("{NOTIFY_RETURNED}", NOTIFY_RETURNED),
                schema,
                table,
            )
        };
        PgStatusStore {
            connect,
            channel: listener::channel(schema, &format!("{table}_status")),
            stop,
            changes: Mutex::new(None),
            create: s(CREATE),
            change: s(CHANGE),
            reset: s(RESET),
            get: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" WHERE id = $1"
            )),
            recent: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" ORDER BY updated_at DESC LIMIT $1"
            )),
            prune: s(PRUNE),
            throughput: s(THROUGHPUT),
            tries: s(TRIES),
            forget_tries: s(FORGET_TRIES),
            list: s(&LIST.replace("{COLUMNS}", COLUMNS)),
            counts: s(COUNTS),
            attempts: s(ATTEMPTS),
            prune_tries: s(PRUNE_TRIES),
            forget_gone: s(FORGET_GONE),
            register: s(REGISTER),
            heartbeat: s(HEARTBEAT),
            stopped: s(STOPPED),
            workers: s(WORKERS),
            keys: Arc::new(KeySql::new(schema, table)),
            controls: Arc::new(SqlControls::new(
                PgRunner(pool.clone()),
                ControlStatements::new(SqlDialect::Postgres)
                    .map(|s| crate::sql::specialise(s, schema, table)),
            )),
            schedules: Arc::new(SqlSchedules::new(
                PgRunner(pool.clone()),
                ScheduleStatements::new(SqlDialect::Postgres, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            checkpoints: Arc::new(SqlCheckpoints::new(
                PgRunner(pool.clone()),
                CheckpointStatements::new(SqlDialect::Postgres, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            job_logs: Arc::new(SqlJobLogs::new(
                PgRunner(pool.clone()),
                JobLogStatements::new(SqlDialect::Postgres, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            limits: Arc::new(PgLimits::new(pool.clone(), schema, table)),
            pool,
        }
    }

    /// The `NOTIFY` channel that announces status changes (payload: ids, comma-separated).
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

fn raw(row: &PgRow) -> std::result::Result<RawStatus, sqlx::Error> {
    Ok(RawStatus {
        id: row.try_get("id")?,
        queue: row.try_get("queue")?,
        kind: row.try_get("kind")?,
        state: row.try_get("state")?,
        attempts: row.try_get("attempts")?,
        progress: row.try_get("progress")?,
        progress_message: row.try_get("progress_message")?,
        result: row.try_get("result")?,
        last_error: row.try_get("last_error")?,
        version: row.try_get("version")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
        payload: row.try_get("payload")?,
        worker: row.try_get("worker")?,
        started_at: row.try_get("started_at")?,
    })
}

fn ids(updates: &[StatusUpdate]) -> Vec<String> {
    updates.iter().map(|u| u.id.to_string()).collect()
}

/// One column of a batch of updates.
fn column(f: fn(&StatusUpdate) -> String, of: &[StatusUpdate]) -> Vec<String> {
    of.iter().map(f).collect()
}

/// The attempts of a batch of updates.
fn attempts(of: &[StatusUpdate]) -> Vec<i32> {
    of.iter()
        .map(|u| i32::try_from(u.attempts).unwrap_or(i32::MAX))
        .collect()
}

impl PgStatusStore {
    /// Creates the records of jobs seen for the first time.
    async fn create_rows(&self, creates: &[StatusUpdate]) -> Result<()> {
        sqlx::query(&self.create)
            .bind(&self.channel)
            .bind(ids(creates))
            .bind(column(|u| u.queue.clone(), creates))
            .bind(column(|u| u.kind.clone(), creates))
            .bind(column(|u| u.state.as_str().to_owned(), creates))
            .bind(attempts(creates))
            .bind(
                creates
                    .iter()
                    .map(|u| u.payload.clone())
                    .collect::<Vec<_>>(),
            )
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }

    /// Applies changes to existing records.
    async fn change_rows(&self, changes: &[StatusUpdate]) -> Result<()> {
        sqlx::query(&self.change)
            .bind(&self.channel)
            .bind(ids(changes))
            .bind(column(|u| u.queue.clone(), changes))
            .bind(column(|u| u.kind.clone(), changes))
            .bind(column(|u| u.state.as_str().to_owned(), changes))
            .bind(attempts(changes))
            .bind(
                changes
                    .iter()
                    .map(|u| u.progress_percent().map(|p| p as i16))
                    .collect::<Vec<Option<i16>>>(),
            )
            .bind(
                changes
                    .iter()
                    .map(|u| u.progress_note().map(str::to_owned))
                    .collect::<Vec<Option<String>>>(),
            )
            .bind(
                changes
                    .iter()
                    .map(StatusUpdate::result_text)
                    .collect::<Vec<_>>(),
            )
            .bind(changes.iter().map(|u| u.error.clone()).collect::<Vec<_>>())
            .bind(
                changes
                    .iter()
                    .map(|u| u.state.is_final())
                    .collect::<Vec<_>>(),
            )
            .bind(
                changes
                    .iter()
                    .map(|u| i32::from(u.starts_run))
                    .collect::<Vec<_>>(),
            )
            .bind(
                changes
                    .iter()
                    .map(|u| u.payload.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(changes.iter().map(|u| u.worker.clone()).collect::<Vec<_>>())
            .bind(
                changes
                    .iter()
                    .map(StatusUpdate::started_ago_micros)
                    .collect::<Vec<_>>(),
            )
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }

    /// Keeps failed attempts.
    async fn try_rows(&self, tries: &[StatusUpdate]) -> Result<()> {
        sqlx::query(&self.tries)
            .bind(ids(tries))
            .bind(attempts(tries))
            .bind(column(|u| u.state.as_str().to_owned(), tries))
            .bind(tries.iter().map(|u| u.error.clone()).collect::<Vec<_>>())
            .bind(tries.iter().map(|u| u.worker.clone()).collect::<Vec<_>>())
            .bind(
                tries
                    .iter()
                    .map(|u| u.ran_for.map(micros))
                    .collect::<Vec<_>>(),
            )
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }
}

#[async_trait]
impl StatusBackend for PgStatusStore {
    fn broker_keys(&self) -> Option<Arc<dyn queue_core::UniqueKeyStore>> {
        Some(Arc::new(PgBrokerKeys::new(
            self.pool.clone(),
            self.keys.clone(),
        )))
    }

    fn limit_store(&self) -> Option<Arc<dyn queue_core::LimitStore>> {
        Some(self.limits.clone())
    }

    fn control_store(&self) -> Option<Arc<dyn queue_core::Controls>> {
        Some(self.controls.clone())
    }

    fn schedule_store(&self) -> Option<Arc<dyn queue_core::schedule::ScheduleStore>> {
        Some(self.schedules.clone())
    }

    fn checkpoint_store(&self) -> Option<Arc<dyn queue_core::checkpoint::CheckpointStore>> {
        Some(self.checkpoints.clone())
    }

    fn job_log_store(&self) -> Option<Arc<dyn queue_core::job_log::JobLogStore>> {
        Some(self.job_logs.clone())
    }

    async fn write(&self, batch: StatusBatch<'_>) -> Result<()> {
        if !batch.creates.is_empty() {
            self.create_rows(batch.creates).await?;
        }
        if !batch.changes.is_empty() {
            self.change_rows(batch.changes).await?;
        }
        if !batch.tries.is_empty() {
            self.try_rows(batch.tries).await?;
        }
        Ok(())
    }

    async fn reset_rows(&self, ids: &[Uuid]) -> Result<u64> {
        let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let row = sqlx::query(&self.reset)
            .bind(&self.channel)
            .bind(&ids)
            .fetch_one(&self.pool)
            .await
            .backend()?;
        sqlx::query(&self.forget_tries)
            .bind(&ids)
            .execute(&self.pool)
            .await
            .backend()?;
        let known: i64 = row.try_get("changed").backend()?;
        Ok(u64::try_from(known).unwrap_or(0))
    }

    async fn status_rows(&self, query: StatusQuery<'_>) -> Result<Vec<RawStatus>> {
        let rows = match query {
            StatusQuery::Get(id) => sqlx::query(&self.get).bind(id.to_string()),
            StatusQuery::Recent(limit) => sqlx::query(&self.recent).bind(limit),
            StatusQuery::List(filter) => {
                let (limit, offset) = filter.page();
                sqlx::query(&self.list)
                    .bind(filter.queue.as_deref())
                    .bind(filter.state.map(JobState::as_str))
                    .bind(filter.id_prefix())
                    .bind(filter.search.as_deref())
                    .bind(limit)
                    .bind(offset)
            }
        }
        .fetch_all(&self.pool)
        .await
        .backend()?;
        rows.iter().map(|r| raw(r).backend()).collect()
    }

    async fn attempt_rows(&self, id: Uuid) -> Result<Vec<RawAttempt>> {
        let rows = sqlx::query(&self.attempts)
            .bind(id.to_string())
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(RawAttempt {
                    id: r.try_get("id").backend()?,
                    attempt: r.try_get("attempt").backend()?,
                    state: r.try_get("state").backend()?,
                    error: r.try_get("error").backend()?,
                    worker: r.try_get("worker").backend()?,
                    started_at: r.try_get("started_at").backend()?,
                    ended_at: r.try_get("ended_at").backend()?,
                })
            })
            .collect()
    }

    async fn count_rows(&self) -> Result<Vec<CountRow>> {
        let rows = sqlx::query(&self.counts)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(CountRow {
                    queue: r.try_get("queue").backend()?,
                    state: r.try_get("state").backend()?,
                    n: r.try_get("n").backend()?,
                })
            })
            .collect()
    }

    async fn bucket_rows(&self, window_us: i64, bucket_us: i64) -> Result<Vec<BucketRow>> {
        let rows = sqlx::query(&self.throughput)
            .bind(window_us)
            .bind(bucket_us)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(BucketRow {
                    queue: r.try_get("queue").backend()?,
                    at_us: r.try_get("bucket").backend()?,
                    completed: r.try_get("completed").backend()?,
                    failed: r.try_get("failed").backend()?,
                })
            })
            .collect()
    }

    async fn prune_slice(&self, table: StatusTable, older_than_us: i64) -> Result<u64> {
        let sql = match table {
            StatusTable::Records => &self.prune,
            StatusTable::Tries => &self.prune_tries,
        };
        Ok(sqlx::query(sql)
            .bind(older_than_us)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected())
    }

    async fn register(&self, w: &WorkerInfo, gone_after_us: i64) -> Result<()> {
        sqlx::query(&self.forget_gone)
            .bind(gone_after_us)
            .execute(&self.pool)
            .await
            .backend()?;
        sqlx::query(&self.register)
            .bind(w.id.to_string())
            .bind(&w.host)
            .bind(i32::try_from(w.pid).unwrap_or(i32::MAX))
            .bind(&w.queue)
            .bind(i32::try_from(w.concurrency).unwrap_or(i32::MAX))
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }

    async fn heartbeat(&self, id: Uuid, jobs_done: i64) -> Result<bool> {
        let n = sqlx::query(&self.heartbeat)
            .bind(id.to_string())
            .bind(jobs_done)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected();
        Ok(n > 0)
    }

    async fn stopped(&self, id: Uuid) -> Result<()> {
        sqlx::query(&self.stopped)
            .bind(id.to_string())
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }

    async fn worker_rows(&self, gone_after_us: i64) -> Result<Vec<WorkerRow>> {
        let rows = sqlx::query(&self.workers)
            .bind(gone_after_us)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(WorkerRow {
                    id: r.try_get("id").backend()?,
                    host: r.try_get("host").backend()?,
                    pid: r.try_get("pid").backend()?,
                    queue: r.try_get("queue").backend()?,
                    concurrency: r.try_get("concurrency").backend()?,
                    started_at: r.try_get("started_at").backend()?,
                    heartbeat_at: r.try_get("heartbeat_at").backend()?,
                    jobs_done: r.try_get("jobs_done").backend()?,
                })
            })
            .collect()
    }

    /// Starts one `LISTEN` task per store on first use (inside a tokio runtime), and
    /// again if it ended (the runtime that ran it was shut down).
    fn watch_changes(&self) -> Option<broadcast::Receiver<Uuid>> {
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((tx, task)) = changes.as_ref() {
            if !task.is_finished() {
                return Some(tx.subscribe());
            }
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = broadcast::channel(4096);
        let sender = tx.clone();
        // `None`: notifications may have been lost (a reconnect); the nil id tells
        // followers to read again.
        let on_notify = move |payload: Option<&str>| match payload {
            Some(ids) => {
                for id in ids.split(',') {
                    if let Ok(id) = Uuid::parse_str(id) {
                        let _ = sender.send(id);
                    }
                }
            }
            None => {
                let _ = sender.send(Uuid::nil());
            }
        };
        let task = handle.spawn(listener::listen_with(
            self.connect.clone(),
            self.channel.clone(),
            on_notify,
            self.stop.clone(),
        ));
        *changes = Some((tx, task));
        Some(rx)
    }
}
