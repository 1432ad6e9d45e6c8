//! Job status and results in `<table>_status` (see `queue_core::status`). MySQL has no
//! notifications: followers poll.

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::sql::{
    micros, BucketRow, CountRow, StatusBackend, StatusBatch, StatusQuery, StatusTable, WorkerRow,
};
use queue_core::status::{JobState, RawAttempt, RawStatus, StatusUpdate, WorkerInfo};
use queue_core::Result;
use sqlx::mysql::MySqlRow;
use sqlx::{MySqlPool, Row};
use uuid::Uuid;

use crate::broker_keys::MySqlBrokerKeys;
use crate::error::SqlxResultExt;
use crate::limits::MySqlLimits;
use crate::runner::MySqlRunner;
use crate::sql::specialise;
use crate::unique_sql::KeySql;
use queue_core::sql::checkpoints::{CheckpointStatements, SqlCheckpoints};
use queue_core::sql::controls::{ControlStatements, SqlControls};
use queue_core::sql::job_logs::{JobLogStatements, SqlJobLogs};
use queue_core::sql::limits::Dialect as SqlDialect;
use queue_core::sql::schedules::{ScheduleStatements, SqlSchedules};

const CREATE_HEAD: &str = "
INSERT IGNORE INTO `switchyard_jobs_status`
    (id, queue, kind, state, attempts, progress, payload, created_at, updated_at) VALUES ";
const CREATE_ROW: &str = "(?, ?, ?, ?, ?, 0, ?, {NOW}, {NOW})";

const CHANGE_HEAD: &str = "
INSERT INTO `switchyard_jobs_status`
    (id, queue, kind, state, attempts, progress, progress_message, result, last_error,
     runs, created_at, updated_at, finished_at, payload, worker, started_at) VALUES ";
const CHANGE_ROW: &str =
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}, IF(?, {NOW}, NULL), ?, ?, {NOW} - ?)";

/// The rule of `queue_core::status::supersedes` (a later attempt; the same attempt while
/// unfinished; or the first start of a job that had ended), decided once per row on the
/// stored values: MySQL assigns left to right, each assignment seeing the ones before,
/// so the first one keeps the decision in `@ok` before `state` or `attempts` change.
/// (MySQL 8 warns that setting a variable inside an expression is deprecated; MariaDB
/// does not.)
const CHANGE_TAIL: &str = "
ON DUPLICATE KEY UPDATE
    progress_message = IF((@ok := {OK}), IF(VALUES(progress) IS NULL, progress_message, VALUES(progress_message)), progress_message),
    progress = IF(@ok, coalesce(VALUES(progress), progress), progress),
    result = IF(@ok, VALUES(result), result),
    last_error = IF(@ok, coalesce(VALUES(last_error), last_error), last_error),
    runs = IF(@ok, runs + VALUES(runs), runs),
    version = IF(@ok, version + 1, version),
    updated_at = IF(@ok, VALUES(updated_at), updated_at),
    finished_at = IF(@ok, VALUES(finished_at), finished_at),
    payload = IF(@ok, coalesce(VALUES(payload), payload), payload),
    worker = IF(@ok, coalesce(VALUES(worker), worker), worker),
    started_at = IF(@ok, coalesce(VALUES(started_at), started_at), started_at),
    queue = IF(@ok, VALUES(queue), queue),
    kind = IF(@ok, VALUES(kind), kind),
    attempts = IF(@ok, VALUES(attempts), attempts),
    state = IF(@ok, VALUES(state), state)";
const OK: &str = "(VALUES(attempts) > attempts \
    OR (VALUES(attempts) = attempts AND state NOT IN ('completed', 'failed', 'dead', 'cancelled')) \
    OR (VALUES(runs) = 1 AND state IN ('completed', 'failed', 'dead', 'cancelled')))";

const RESET: &str = "
UPDATE `switchyard_jobs_status`
   SET state = 'pending', attempts = 0, progress = 0, progress_message = NULL, result = NULL,
       finished_at = NULL, worker = NULL, started_at = NULL, version = version + 1, updated_at = {NOW}
 WHERE id = ? AND state IN ('failed', 'dead')";

const COLUMNS: &str = "id, queue, kind, state, CAST(attempts AS SIGNED) AS attempts, \
    CAST(coalesce(progress, 0) AS SIGNED) AS progress, progress_message, result, last_error, \
    version, created_at, updated_at, finished_at, payload, worker, started_at";

/// Failed attempts, one per id and attempt; the latest word on an attempt wins (a job
/// published again under its id counts attempts anew).
const TRIES_HEAD: &str = "
INSERT INTO `switchyard_jobs_tries` (id, attempt, state, error, worker, started_at, ended_at)
VALUES ";
const TRIES_ROW: &str = "(?, ?, ?, ?, ?, {NOW} - ?, {NOW})";
const TRIES_TAIL: &str = "
ON DUPLICATE KEY UPDATE state = VALUES(state), error = VALUES(error), worker = VALUES(worker),
    started_at = VALUES(started_at), ended_at = VALUES(ended_at)";

/// A replayed job starts over: its old attempts go with its reset.
const FORGET_TRIES: &str = "
DELETE t FROM `switchyard_jobs_tries` t JOIN `switchyard_jobs_status` s ON s.id = t.id
 WHERE t.id = ? AND s.state = 'pending'";

const LIST: &str = "
SELECT {COLUMNS} FROM `switchyard_jobs_status`
 WHERE (? IS NULL OR queue = ?) AND (? IS NULL OR state = ?)
   AND (? IS NULL OR id LIKE ? OR kind = ?)
 ORDER BY updated_at DESC LIMIT ? OFFSET ?";

const COUNTS: &str = "
SELECT queue, state, CAST(COUNT(*) AS SIGNED) AS n FROM `switchyard_jobs_status`
 GROUP BY queue, state";

const ATTEMPTS: &str = "
SELECT id, CAST(attempt AS SIGNED) AS attempt, state, error, worker, started_at, ended_at
  FROM `switchyard_jobs_tries` WHERE id = ? ORDER BY attempt";

const PRUNE_TRIES: &str = "
DELETE FROM `switchyard_jobs_tries` WHERE ended_at < {NOW} - ? LIMIT 10000";

/// Registering forgets workers gone silent.
const FORGET_GONE: &str = "DELETE FROM `switchyard_jobs_procs` WHERE heartbeat_at < {NOW} - ?";

const REGISTER: &str = "
INSERT INTO `switchyard_jobs_procs`
    (id, host, pid, queue, concurrency, started_at, heartbeat_at, jobs_done)
VALUES (?, ?, ?, ?, ?, {NOW}, {NOW}, 0)
ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at)";

const HEARTBEAT: &str = "
UPDATE `switchyard_jobs_procs` SET heartbeat_at = {NOW}, jobs_done = ? WHERE id = ?";

const STOPPED: &str = "DELETE FROM `switchyard_jobs_procs` WHERE id = ?";

const WORKERS: &str = "
SELECT id, host, pid, queue, CAST(concurrency AS SIGNED) AS concurrency, started_at,
       heartbeat_at, jobs_done
  FROM `switchyard_jobs_procs` WHERE heartbeat_at >= {NOW} - ? ORDER BY started_at, id";

const PRUNE: &str = "
DELETE FROM `switchyard_jobs_status`
 WHERE finished_at IS NOT NULL AND finished_at < {NOW} - ? LIMIT 10000";

const THROUGHPUT: &str = "
SELECT queue, CAST(FLOOR(finished_at / ?) * ? AS SIGNED) AS bucket,
       CAST(SUM(state = 'completed') AS SIGNED) AS completed,
       CAST(SUM(state IN ('failed', 'dead')) AS SIGNED) AS failed
  FROM `switchyard_jobs_status`
 WHERE finished_at IS NOT NULL AND finished_at >= {NOW} - ?
 GROUP BY 1, 2 ORDER BY 2, 1";

/// The status store of a MySQL transport.
#[derive(Debug, Clone)]
pub struct MySqlStatusStore {
    pool: MySqlPool,
    create_head: String,
    create_row: String,
    change_head: String,
    change_row: String,
    change_tail: String,
    reset: String,
    get: String,
    recent: String,
    prune: String,
    throughput: String,
    tries_head: String,
    tries_row: String,
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
    known: String,
    /// The key table's statements, for the broker key store.
    keys: Arc<KeySql>,
    /// The limit tables.
    limits: Arc<MySqlLimits>,
    /// The control tables.
    controls: Arc<SqlControls<MySqlRunner>>,
    /// The schedule table.
    schedules: Arc<SqlSchedules<MySqlRunner>>,
    /// The checkpoint table.
    checkpoints: Arc<SqlCheckpoints<MySqlRunner>>,
    /// The job log table.
    job_logs: Arc<SqlJobLogs<MySqlRunner>>,
}

impl MySqlStatusStore {
    pub(crate) fn new(
        pool: MySqlPool,
        schema: Option<&str>,
        table: &str,
        keys: Arc<KeySql>,
    ) -> Self {
        let s = |sql: &str| specialise(sql, schema, table);
        MySqlStatusStore {
            controls: Arc::new(SqlControls::new(
                MySqlRunner(pool.clone()),
                ControlStatements::new(SqlDialect::MySql)
                    .map(|s| crate::sql::specialise(s, schema, table)),
            )),
            schedules: Arc::new(SqlSchedules::new(
                MySqlRunner(pool.clone()),
                ScheduleStatements::new(SqlDialect::MySql, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            checkpoints: Arc::new(SqlCheckpoints::new(
                MySqlRunner(pool.clone()),
                CheckpointStatements::new(SqlDialect::MySql, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            job_logs: Arc::new(SqlJobLogs::new(
                MySqlRunner(pool.clone()),
                JobLogStatements::new(SqlDialect::MySql, |s| {
                    crate::sql::specialise(s, schema, table)
                }),
            )),
            limits: Arc::new(MySqlLimits::new(pool.clone(), schema, table)),
            pool,
            create_head: s(CREATE_HEAD),
            create_row: s(CREATE_ROW),
            change_head: s(CHANGE_HEAD),
            change_row: s(CHANGE_ROW),
            change_tail: s(&CHANGE_TAIL.replace("{OK}", OK)),
            reset: s(RESET),
            get: s(&format!(
                "SELECT {COLUMNS} FROM `switchyard_jobs_status` WHERE id = ?"
            )),
            recent: s(&format!(
                "SELECT {COLUMNS} FROM `switchyard_jobs_status` ORDER BY updated_at DESC LIMIT ?"
            )),
            prune: s(PRUNE),
            throughput: s(THROUGHPUT),
            tries_head: s(TRIES_HEAD),
            tries_row: s(TRIES_ROW),
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
            known: s("SELECT CAST(1 AS SIGNED) FROM `switchyard_jobs_procs` WHERE id = ?"),
            keys,
        }
    }
}

/// Text columns under a binary collation arrive as bytes.
fn text(row: &MySqlRow, column: &str) -> std::result::Result<String, sqlx::Error> {
    let bytes: Vec<u8> = row.try_get(column)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn opt_text(row: &MySqlRow, column: &str) -> std::result::Result<Option<String>, sqlx::Error> {
    let bytes: Option<Vec<u8>> = row.try_get(column)?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn raw(row: &MySqlRow) -> std::result::Result<RawStatus, sqlx::Error> {
    Ok(RawStatus {
        id: text(row, "id")?,
        queue: text(row, "queue")?,
        kind: text(row, "kind")?,
        state: text(row, "state")?,
        attempts: row.try_get("attempts")?,
        progress: row.try_get("progress")?,
        progress_message: opt_text(row, "progress_message")?,
        result: opt_text(row, "result")?,
        last_error: opt_text(row, "last_error")?,
        version: row.try_get("version")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
        payload: opt_text(row, "payload")?,
        worker: opt_text(row, "worker")?,
        started_at: row.try_get("started_at")?,
    })
}

fn rows(head: &str, row: &str, n: usize) -> String {
    let mut sql = String::with_capacity(head.len() + n * (row.len() + 2));
    sql.push_str(head);
    for i in 0..n {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(row);
    }
    sql
}

impl MySqlStatusStore {
    /// Creates the records of jobs seen for the first time.
    async fn create_rows(&self, creates: &[StatusUpdate]) -> Result<()> {
        let sql = rows(&self.create_head, &self.create_row, creates.len());
        // One statement per batch size: not worth a slot in the statement cache.
        let mut q = sqlx::query(&sql).persistent(false);
        for u in creates {
            q = q
                .bind(u.id.to_string())
                .bind(u.queue.as_str())
                .bind(u.kind.as_str())
                .bind(u.state.as_str())
                .bind(i64::from(u.attempts))
                .bind(u.payload.as_deref());
        }
        q.execute(&self.pool).await.backend()?;
        Ok(())
    }

    /// Applies changes to existing records.
    async fn change_rows(&self, changes: &[StatusUpdate]) -> Result<()> {
        let mut sql = rows(&self.change_head, &self.change_row, changes.len());
        sql.push_str(&self.change_tail);
        let mut q = sqlx::query(&sql).persistent(false);
        for u in changes {
            q = q
                .bind(u.id.to_string())
                .bind(u.queue.as_str())
                .bind(u.kind.as_str())
                .bind(u.state.as_str())
                .bind(i64::from(u.attempts))
                .bind(u.progress_percent())
                .bind(u.progress_note())
                .bind(u.result_text())
                .bind(u.error.as_deref())
                .bind(i64::from(u.starts_run))
                .bind(u.state.is_final())
                .bind(u.payload.as_deref())
                .bind(u.worker.as_deref())
                .bind(u.started_ago_micros());
        }
        q.execute(&self.pool).await.backend()?;
        Ok(())
    }

    /// Keeps failed attempts.
    async fn try_rows(&self, tries: &[StatusUpdate]) -> Result<()> {
        let mut sql = rows(&self.tries_head, &self.tries_row, tries.len());
        sql.push_str(TRIES_TAIL);
        let mut q = sqlx::query(&sql).persistent(false);
        for u in tries {
            q = q
                .bind(u.id.to_string())
                .bind(i64::from(u.attempts))
                .bind(u.state.as_str())
                .bind(u.error.as_deref())
                .bind(u.worker.as_deref())
                .bind(u.ran_for.map(micros));
        }
        q.execute(&self.pool).await.backend()?;
        Ok(())
    }
}

#[async_trait]
impl StatusBackend for MySqlStatusStore {
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

    fn broker_keys(&self) -> Option<Arc<dyn queue_core::UniqueKeyStore>> {
        Some(Arc::new(MySqlBrokerKeys::new(
            self.pool.clone(),
            self.keys.clone(),
        )))
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
        let mut known = 0;
        for id in ids {
            known += sqlx::query(&self.reset)
                .bind(id.to_string())
                .execute(&self.pool)
                .await
                .backend()?
                .rows_affected();
            sqlx::query(&self.forget_tries)
                .bind(id.to_string())
                .execute(&self.pool)
                .await
                .backend()?;
        }
        Ok(known)
    }

    async fn status_rows(&self, query: StatusQuery<'_>) -> Result<Vec<RawStatus>> {
        let rows = match query {
            StatusQuery::Get(id) => sqlx::query(&self.get).bind(id.to_string()),
            StatusQuery::Recent(limit) => sqlx::query(&self.recent).bind(limit),
            // MySQL has no numbered parameters: each one used twice is bound twice.
            StatusQuery::List(filter) => {
                let (limit, offset) = filter.page();
                let state = filter.state.map(JobState::as_str);
                let prefix = filter.id_prefix();
                sqlx::query(&self.list)
                    .bind(filter.queue.as_deref())
                    .bind(filter.queue.as_deref())
                    .bind(state)
                    .bind(state)
                    .bind(prefix.clone())
                    .bind(prefix)
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
                    id: text(r, "id").backend()?,
                    attempt: r.try_get("attempt").backend()?,
                    state: text(r, "state").backend()?,
                    error: opt_text(r, "error").backend()?,
                    worker: opt_text(r, "worker").backend()?,
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
                    queue: text(r, "queue").backend()?,
                    state: text(r, "state").backend()?,
                    n: r.try_get("n").backend()?,
                })
            })
            .collect()
    }

    async fn bucket_rows(&self, window_us: i64, bucket_us: i64) -> Result<Vec<BucketRow>> {
        let rows = sqlx::query(&self.throughput)
            .bind(bucket_us)
            .bind(bucket_us)
            .bind(window_us)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(BucketRow {
                    queue: text(r, "queue").backend()?,
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
            .bind(i64::from(w.pid))
            .bind(&w.queue)
            .bind(i64::from(w.concurrency))
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(())
    }

    async fn heartbeat(&self, id: Uuid, jobs_done: i64) -> Result<bool> {
        let n = sqlx::query(&self.heartbeat)
            .bind(jobs_done)
            .bind(id.to_string())
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected();
        // MySQL counts changed rows: a heartbeat within the same microsecond with the
        // same count changes nothing, yet the worker is known.
        if n > 0 {
            return Ok(true);
        }
        let known: Option<i64> = sqlx::query_scalar(&self.known)
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .backend()?;
        Ok(known.is_some())
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
                    id: text(r, "id").backend()?,
                    host: text(r, "host").backend()?,
                    pid: r.try_get("pid").backend()?,
                    queue: text(r, "queue").backend()?,
                    concurrency: r.try_get("concurrency").backend()?,
                    started_at: r.try_get("started_at").backend()?,
                    heartbeat_at: r.try_get("heartbeat_at").backend()?,
                    jobs_done: r.try_get("jobs_done").backend()?,
                })
            })
            .collect()
    }
}
