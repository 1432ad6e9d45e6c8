//! Job status and results in `<table>_status` (see `queue_core::status`).

use std::sync::Arc;

use async_trait::async_trait;
use queue_core::sql::{
    micros, BucketRow, CountRow, StatusBackend, StatusBatch, StatusQuery, StatusTable, WorkerRow,
};
use queue_core::status::{JobState, RawAttempt, RawStatus, StatusUpdate, WorkerInfo};
use queue_core::Result;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};
use uuid::Uuid;

use crate::broker_keys::SqliteBrokerKeys;
use crate::error::SqlxResultExt;
use crate::limits::SqliteLimits;
use crate::runner::SqliteRunner;
use crate::sql::specialise;
use crate::unique_sql::KeySql;
use queue_core::sql::checkpoints::{CheckpointStatements, SqlCheckpoints};
use queue_core::sql::controls::{ControlStatements, SqlControls};
use queue_core::sql::job_logs::{JobLogStatements, SqlJobLogs};
use queue_core::sql::limits::Dialect as SqlDialect;
use queue_core::sql::schedules::{ScheduleStatements, SqlSchedules};

/// Rows come bound, as `VALUES (id, queue, kind, state, attempts, payload), …` between
/// head and tail (see [`bind_rows`]), one statement per 500 rows. They came as one JSON
/// array read with `json_each`, whose extraction of every field of every row made the
/// drain recording status the slowest of the SQL backends' (0.49 of the plain drain).
const CREATE_HEAD: &str = "
INSERT INTO \"switchyard_jobs_status\"
    (id, queue, kind, state, attempts, progress, payload, created_at, updated_at)
SELECT v.column1, v.column2, v.column3, v.column4, v.column5, 0, v.column6, n.now, n.now
  FROM (SELECT {NOW} AS now) AS n, (";
const CREATE_TAIL: &str = ") AS v WHERE true ON CONFLICT (id) DO NOTHING";

/// Rows as for [`CREATE_HEAD`]: `(id, queue, kind, state, attempts, progress, note,
/// result, error, final, starts_run, payload, worker, started_ago)`.
const CHANGE_HEAD: &str = "
INSERT INTO \"switchyard_jobs_status\"
    (id, queue, kind, state, attempts, progress, progress_message, result, last_error,
     runs, created_at, updated_at, finished_at, payload, worker, started_at)
SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7,
       v.column8, v.column9, v.column11, n.now, n.now, CASE WHEN v.column10 THEN n.now END,
       v.column12, v.column13, n.now - v.column14
  FROM (SELECT {NOW} AS now) AS n, (";
/// The rule of `queue_core::status::supersedes`: a later attempt; the same attempt while
/// unfinished; or the first start of a job that had ended (replayed, or its id
/// published again).
const CHANGE_TAIL: &str = ") AS v WHERE true
ON CONFLICT (id) DO UPDATE SET
    state = excluded.state,
    attempts = excluded.attempts,
    progress = coalesce(excluded.progress, progress),
    progress_message = CASE WHEN excluded.progress IS NULL THEN progress_message
                            ELSE excluded.progress_message END,
    result = excluded.result,
    last_error = coalesce(excluded.last_error, last_error),
    runs = runs + excluded.runs,
    version = version + 1,
    updated_at = excluded.updated_at,
    finished_at = excluded.finished_at,
    payload = coalesce(excluded.payload, payload),
    worker = coalesce(excluded.worker, worker),
    started_at = coalesce(excluded.started_at, started_at)
WHERE excluded.attempts > attempts
   OR (excluded.attempts = attempts AND state NOT IN ('completed', 'failed', 'dead', 'cancelled'))
   OR (excluded.runs = 1 AND state IN ('completed', 'failed', 'dead', 'cancelled'))";

/// Failed attempts: `[id, attempt, state, error, worker, started_ago]`. The latest word
/// on an attempt wins (a job published again under its id counts attempts anew).
const TRIES: &str = "
INSERT INTO \"switchyard_jobs_tries\"
    (id, attempt, state, error, worker, started_at, ended_at)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, {NOW} - value->>5, {NOW}
  FROM json_each(?1) WHERE true
ON CONFLICT (id, attempt) DO UPDATE SET
    state = excluded.state, error = excluded.error, worker = excluded.worker,
    started_at = excluded.started_at, ended_at = excluded.ended_at";

/// A replayed job starts over: its old attempts go with its reset.
const FORGET_TRIES: &str = "
DELETE FROM \"switchyard_jobs_tries\" WHERE id = ?1
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs_status\" WHERE id = ?1 AND state = 'pending')";

const RESET: &str = "
UPDATE \"switchyard_jobs_status\"
   SET state = 'pending', attempts = 0, progress = 0, progress_message = NULL, result = NULL,
       finished_at = NULL, worker = NULL, started_at = NULL, version = version + 1, updated_at = {NOW}
 WHERE id = ?1 AND state IN ('failed', 'dead')";

const COLUMNS: &str = "id, queue, kind, state, attempts, coalesce(progress, 0) AS progress, \
                       progress_message, result, last_error, version, created_at, updated_at, \
                       finished_at, payload, worker, started_at";

const LIST: &str = "
SELECT {COLUMNS} FROM \"switchyard_jobs_status\"
 WHERE (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR state = ?2)
   AND (?3 IS NULL OR id LIKE ?3 OR kind = ?4)
 ORDER BY updated_at DESC LIMIT ?5 OFFSET ?6";

const COUNTS: &str = "
SELECT queue, state, count(*) AS n FROM \"switchyard_jobs_status\" GROUP BY queue, state";

const ATTEMPTS: &str = "
SELECT id, attempt, state, error, worker, started_at, ended_at
  FROM \"switchyard_jobs_tries\" WHERE id = ?1 ORDER BY attempt";

const PRUNE_TRIES: &str = "
DELETE FROM \"switchyard_jobs_tries\" WHERE rowid IN (
    SELECT rowid FROM \"switchyard_jobs_tries\" WHERE ended_at < {NOW} - ?1 LIMIT 10000)";

/// Registering forgets workers gone silent.
const FORGET_GONE: &str = "DELETE FROM \"switchyard_jobs_procs\" WHERE heartbeat_at < {NOW} - ?1";

const REGISTER: &str = "
INSERT INTO \"switchyard_jobs_procs\"
    (id, host, pid, queue, concurrency, started_at, heartbeat_at, jobs_done)
VALUES (?1, ?2, ?3, ?4, ?5, {NOW}, {NOW}, 0)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = {NOW}";

const HEARTBEAT: &str = "
UPDATE \"switchyard_jobs_procs\" SET heartbeat_at = {NOW}, jobs_done = ?2 WHERE id = ?1";

const STOPPED: &str = "DELETE FROM \"switchyard_jobs_procs\" WHERE id = ?1";

const WORKERS: &str = "
SELECT id, host, pid, queue, concurrency, started_at, heartbeat_at, jobs_done
  FROM \"switchyard_jobs_procs\" WHERE heartbeat_at >= {NOW} - ?1 ORDER BY started_at, id";

const PRUNE: &str = "
DELETE FROM \"switchyard_jobs_status\" WHERE id IN (
    SELECT id FROM \"switchyard_jobs_status\"
     WHERE finished_at IS NOT NULL AND finished_at < {NOW} - ?1 LIMIT 10000)";

const THROUGHPUT: &str = "
SELECT queue, (finished_at / ?2) * ?2 AS bucket,
       sum(state = 'completed') AS completed, sum(state IN ('failed', 'dead')) AS failed
  FROM \"switchyard_jobs_status\"
 WHERE finished_at IS NOT NULL AND finished_at >= {NOW} - ?1
 GROUP BY queue, bucket ORDER BY bucket, queue";

/// The status store of a SQLite transport: writes through the transport's one writer
/// connection, reads through its readers.
#[derive(Debug, Clone)]
pub struct SqliteStatusStore {
    writer: SqlitePool,
    reader: SqlitePool,
    create: (String, String),
    change: (String, String),
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
    limits: Arc<SqliteLimits>,
    /// The control tables.
    controls: Arc<SqlControls<SqliteRunner>>,
    /// The schedule table.
    schedules: Arc<SqlSchedules<SqliteRunner>>,
    /// The checkpoint table.
    checkpoints: Arc<SqlCheckpoints<SqliteRunner>>,
    /// The job log table.
    job_logs: Arc<SqlJobLogs<SqliteRunner>>,
}

impl SqliteStatusStore {
    pub(crate) fn new(writer: SqlitePool, reader: SqlitePool, table: &str) -> Self {
        let s = |sql: &str| specialise(sql, table);
        SqliteStatusStore {
            controls: Arc::new(SqlControls::new(
                SqliteRunner(writer.clone()),
                ControlStatements::new(SqlDialect::Sqlite)
                    .map(|s| crate::sql::specialise(s, table)),
            )),
            schedules: Arc::new(SqlSchedules::new(
                SqliteRunner(writer.clone()),
                ScheduleStatements::new(SqlDialect::Sqlite, |s| crate::sql::specialise(s, table)),
            )),
            checkpoints: Arc::new(SqlCheckpoints::new(
                SqliteRunner(writer.clone()),
                CheckpointStatements::new(SqlDialect::Sqlite, |s| crate::sql::specialise(s, table)),
            )),
            job_logs: Arc::new(SqlJobLogs::new(
                SqliteRunner(writer.clone()),
                JobLogStatements::new(SqlDialect::Sqlite, |s| crate::sql::specialise(s, table)),
            )),
            limits: Arc::new(SqliteLimits::new(writer.clone(), table)),
            writer,
            reader,
            create: (s(CREATE_HEAD), s(CREATE_TAIL)),
            change: (s(CHANGE_HEAD), s(CHANGE_TAIL)),
            reset: s(RESET),
            get: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" WHERE id = ?1"
            )),
            recent: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" ORDER BY updated_at DESC LIMIT ?1"
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
            keys: Arc::new(KeySql::new(table)),
        }
    }

    /// Writes a batch's rows on `conn` in [`statements`] statements: all or nothing only
    /// in a transaction, or when that is one (see `write`).
    async fn write_rows(
        &self,
        conn: &mut sqlx::SqliteConnection,
        batch: StatusBatch<'_>,
    ) -> Result<()> {
        bind_rows(&mut *conn, &self.create, batch.creates, |mut b, u| {
            b.push_bind(u.id.to_string())
                .push_bind(u.queue.as_str())
                .push_bind(u.kind.as_str())
                .push_bind(u.state.as_str())
                .push_bind(i64::from(u.attempts))
                .push_bind(u.payload.as_deref());
        })
        .await?;
        bind_rows(&mut *conn, &self.change, batch.changes, |mut b, u| {
            b.push_bind(u.id.to_string())
                .push_bind(u.queue.as_str())
                .push_bind(u.kind.as_str())
                .push_bind(u.state.as_str())
                .push_bind(i64::from(u.attempts))
                .push_bind(u.progress_percent())
                .push_bind(u.progress_note())
                .push_bind(u.result_text())
                .push_bind(u.error.as_deref())
                .push_bind(u.state.is_final())
                .push_bind(i64::from(u.starts_run))
                .push_bind(u.payload.as_deref())
                .push_bind(u.worker.as_deref())
                .push_bind(u.started_ago_micros());
        })
        .await?;
        if !batch.tries.is_empty() {
            sqlx::query(&self.tries)
                .bind(try_rows(batch.tries))
                .execute(&mut *conn)
                .await
                .backend()?;
        }
        Ok(())
    }
}

fn raw(row: &SqliteRow) -> std::result::Result<RawStatus, sqlx::Error> {
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

/// Rows per statement: 14 parameters each, well under SQLite's 32,766.
const ROWS_PER_STATEMENT: usize = 500;

/// Runs `head VALUES (…), (…) tail` for each chunk of `rows`, binding each row's
/// parameters with `bind`.
async fn bind_rows<'a>(
    conn: &mut sqlx::SqliteConnection,
    (head, tail): &(String, String),
    rows: &'a [StatusUpdate],
    bind: impl Fn(sqlx::query_builder::Separated<'_, 'a, Sqlite, &'static str>, &'a StatusUpdate),
) -> Result<()> {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut qb: QueryBuilder<'a, Sqlite> = QueryBuilder::new(head);
        qb.push_values(chunk, &bind);
        qb.push(tail);
        // Not kept prepared: batch sizes vary, so each size would be one more large
        // statement in the writer connection's cache, seldom used again.
        qb.build()
            .persistent(false)
            .execute(&mut *conn)
            .await
            .backend()?;
    }
    Ok(())
}

/// How many statements [`SqliteStatusStore::write_rows`] runs for `batch`: one per chunk
/// of creations and of changes, one for all failed attempts. `write` leaves out its
/// transaction when this is one, so it must count as [`bind_rows`] cuts.
fn statements(batch: &StatusBatch<'_>) -> usize {
    batch.creates.len().div_ceil(ROWS_PER_STATEMENT)
        + batch.changes.len().div_ceil(ROWS_PER_STATEMENT)
        + usize::from(!batch.tries.is_empty())
}

/// Failed attempts as one JSON array of arrays (see [`TRIES`]).
fn try_rows(of: &[StatusUpdate]) -> String {
    let rows: Vec<serde_json::Value> = of
        .iter()
        .map(|u| {
            serde_json::json!([
                u.id.to_string(),
                u.attempts,
                u.state.as_str(),
                u.error,
                u.worker,
                u.ran_for.map(micros),
            ])
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

#[async_trait]
impl StatusBackend for SqliteStatusStore {
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
        Some(Arc::new(SqliteBrokerKeys::new(
            self.writer.clone(),
            self.keys.clone(),
        )))
    }

    /// One statement on its own, or one transaction, so that the single writer takes its
    /// lock once. Without BEGIN and COMMIT, a batch that takes one statement (changes
    /// alone, as most are while jobs run) holds the writer connection, which claims and
    /// acks wait for, for one call instead of three.
    async fn write(&self, batch: StatusBatch<'_>) -> Result<()> {
        match statements(&batch) {
            0 => return Ok(()),
            1 => {
                let mut conn = self.writer.acquire().await.backend()?;
                return self.write_rows(&mut conn, batch).await;
            }
            _ => {}
        }
        let mut tx = self.writer.begin().await.backend()?;
        self.write_rows(&mut tx, batch).await?;
        tx.commit().await.backend()
    }

    async fn reset_rows(&self, ids: &[Uuid]) -> Result<u64> {
        let mut tx = self.writer.begin().await.backend()?;
        let mut known = 0;
        for id in ids {
            known += sqlx::query(&self.reset)
                .bind(id.to_string())
                .execute(&mut *tx)
                .await
                .backend()?
                .rows_affected();
            sqlx::query(&self.forget_tries)
                .bind(id.to_string())
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()?;
        Ok(known)
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
        .fetch_all(&self.reader)
        .await
        .backend()?;
        rows.iter().map(|r| raw(r).backend()).collect()
    }

    async fn attempt_rows(&self, id: Uuid) -> Result<Vec<RawAttempt>> {
        let rows = sqlx::query(&self.attempts)
            .bind(id.to_string())
            .fetch_all(&self.reader)
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
            .fetch_all(&self.reader)
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
            .fetch_all(&self.reader)
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
            .execute(&self.writer)
            .await
            .backend()?
            .rows_affected())
    }

    async fn register(&self, w: &WorkerInfo, gone_after_us: i64) -> Result<()> {
        let mut tx = self.writer.begin().await.backend()?;
        sqlx::query(&self.forget_gone)
            .bind(gone_after_us)
            .execute(&mut *tx)
            .await
            .backend()?;
        sqlx::query(&self.register)
            .bind(w.id.to_string())
            .bind(&w.host)
            .bind(i64::from(w.pid))
            .bind(&w.queue)
            .bind(i64::from(w.concurrency))
            .execute(&mut *tx)
            .await
            .backend()?;
        tx.commit().await.backend()
    }

    async fn heartbeat(&self, id: Uuid, jobs_done: i64) -> Result<bool> {
        let n = sqlx::query(&self.heartbeat)
            .bind(id.to_string())
            .bind(jobs_done)
            .execute(&self.writer)
            .await
            .backend()?
            .rows_affected();
        Ok(n > 0)
    }

    async fn stopped(&self, id: Uuid) -> Result<()> {
        sqlx::query(&self.stopped)
            .bind(id.to_string())
            .execute(&self.writer)
            .await
            .backend()?;
        Ok(())
    }

    async fn worker_rows(&self, gone_after_us: i64) -> Result<Vec<WorkerRow>> {
        let rows = sqlx::query(&self.workers)
            .bind(gone_after_us)
            .fetch_all(&self.reader)
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
}
