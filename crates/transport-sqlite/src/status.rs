//! Job status and results in `<table>_status` (see `queue_core::status`).

use std::time::Duration;

use async_trait::async_trait;
use queue_core::status::{
    fold_updates, micros, prune_in_slices, JobStatus, RawStatus, StatusStore, StatusUpdate,
    Throughput,
};
use queue_core::Result;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use crate::error::SqlxResultExt;
use crate::sql::specialise;

/// Rows come as one JSON array of arrays: `[id, queue, kind, state, attempts, progress,
/// note, result, error, final, starts_run]`, so that a batch is one statement.
const CREATE: &str = "
INSERT INTO \"switchyard_jobs_status\"
    (id, queue, kind, state, attempts, progress, created_at, updated_at)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, 0, {NOW}, {NOW}
  FROM json_each(?1) WHERE true
ON CONFLICT (id) DO NOTHING";

/// The rule of `queue_core::status::supersedes`: a later attempt; the same attempt while
/// unfinished; or the first start of a job that had ended (replayed, or its id
/// published again).
const CHANGE: &str = "
INSERT INTO \"switchyard_jobs_status\"
    (id, queue, kind, state, attempts, progress, progress_message, result, last_error,
     runs, created_at, updated_at, finished_at)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6,
       value->>7, value->>8, value->>10, {NOW}, {NOW}, CASE WHEN value->>9 THEN {NOW} END
  FROM json_each(?1) WHERE true
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
    finished_at = excluded.finished_at
WHERE excluded.attempts > attempts
   OR (excluded.attempts = attempts AND state NOT IN ('completed', 'failed', 'dead'))
   OR (excluded.runs = 1 AND state IN ('completed', 'failed', 'dead'))";

const RESET: &str = "
UPDATE \"switchyard_jobs_status\"
   SET state = 'pending', attempts = 0, progress = 0, progress_message = NULL, result = NULL,
       finished_at = NULL, version = version + 1, updated_at = {NOW}
 WHERE id = ?1 AND state IN ('failed', 'dead')";

const COLUMNS: &str = "id, queue, kind, state, attempts, coalesce(progress, 0) AS progress, \
                       progress_message, result, last_error, version, created_at, updated_at, \
                       finished_at";

const PRUNE: &str = "
DELETE FROM \"switchyard_jobs_status\" WHERE id IN (
    SELECT id FROM \"switchyard_jobs_status\"
     WHERE finished_at IS NOT NULL AND finished_at < {NOW} - ?1 LIMIT 10000)";

const THROUGHPUT: &str = "
SELECT queue, (finished_at / ?2) * ?2 AS bucket,
       sum(state = 'completed') AS completed, sum(state <> 'completed') AS failed
  FROM \"switchyard_jobs_status\"
 WHERE finished_at IS NOT NULL AND finished_at >= {NOW} - ?1
 GROUP BY queue, bucket ORDER BY bucket, queue";

/// The status store of a SQLite transport: writes through the transport's one writer
/// connection, reads through its readers.
#[derive(Debug, Clone)]
pub struct SqliteStatusStore {
    writer: SqlitePool,
    reader: SqlitePool,
    create: String,
    change: String,
    reset: String,
    get: String,
    recent: String,
    prune: String,
    throughput: String,
}

impl SqliteStatusStore {
    pub(crate) fn new(writer: SqlitePool, reader: SqlitePool, table: &str) -> Self {
        let s = |sql: &str| specialise(sql, table);
        SqliteStatusStore {
            writer,
            reader,
            create: s(CREATE),
            change: s(CHANGE),
            reset: s(RESET),
            get: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" WHERE id = ?1"
            )),
            recent: s(&format!(
                "SELECT {COLUMNS} FROM \"switchyard_jobs_status\" ORDER BY updated_at DESC LIMIT ?1"
            )),
            prune: s(PRUNE),
            throughput: s(THROUGHPUT),
        }
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
    })
}

#[async_trait]
impl StatusStore for SqliteStatusStore {
    async fn record(&self, updates: &[StatusUpdate]) -> Result<()> {
        let (creates, changes) = fold_updates(updates);
        let rows = |of: &[StatusUpdate]| -> String {
            let rows: Vec<serde_json::Value> = of
                .iter()
                .map(|u| {
                    serde_json::json!([
                        u.id.to_string(),
                        u.queue,
                        u.kind,
                        u.state.as_str(),
                        u.attempts,
                        u.progress_percent(),
                        u.progress_note(),
                        u.result_text(),
                        u.error,
                        u.state.is_final(),
                        i64::from(u.starts_run),
                    ])
                })
                .collect();
            serde_json::Value::Array(rows).to_string()
        };
        let mut tx = self.writer.begin().await.backend()?;
        if !creates.is_empty() {
            sqlx::query(&self.create)
                .bind(rows(&creates))
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        if !changes.is_empty() {
            sqlx::query(&self.change)
                .bind(rows(&changes))
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        tx.commit().await.backend()
    }

    async fn reset(&self, ids: &[Uuid]) -> Result<u64> {
        let mut tx = self.writer.begin().await.backend()?;
        let mut known = 0;
        for id in ids {
            known += sqlx::query(&self.reset)
                .bind(id.to_string())
                .execute(&mut *tx)
                .await
                .backend()?
                .rows_affected();
        }
        tx.commit().await.backend()?;
        Ok(known)
    }

    async fn get(&self, id: Uuid) -> Result<Option<JobStatus>> {
        let row = sqlx::query(&self.get)
            .bind(id.to_string())
            .fetch_optional(&self.reader)
            .await
            .backend()?;
        row.map(|r| raw(&r).backend()?.decode()).transpose()
    }

    async fn recent(&self, limit: usize) -> Result<Vec<JobStatus>> {
        let rows = sqlx::query(&self.recent)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.reader)
            .await
            .backend()?;
        rows.iter().map(|r| raw(r).backend()?.decode()).collect()
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        prune_in_slices(|| async {
            Ok(sqlx::query(&self.prune)
                .bind(micros(older_than))
                .execute(&self.writer)
                .await
                .backend()?
                .rows_affected())
        })
        .await
    }

    async fn throughput(&self, window: Duration, bucket: Duration) -> Result<Vec<Throughput>> {
        let rows = sqlx::query(&self.throughput)
            .bind(micros(window))
            .bind(micros(bucket).max(1))
            .fetch_all(&self.reader)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(Throughput::from_row(
                    r.try_get("queue").backend()?,
                    r.try_get("bucket").backend()?,
                    r.try_get("completed").backend()?,
                    r.try_get("failed").backend()?,
                ))
            })
            .collect()
    }
}
