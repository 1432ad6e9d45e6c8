//! Job status and results in `<table>_status` (see `queue_core::status`). MySQL has no
//! notifications: followers poll.

use std::time::Duration;

use async_trait::async_trait;
use queue_core::status::{
    fold_updates, micros, prune_in_slices, JobStatus, RawStatus, StatusStore, StatusUpdate,
    Throughput,
};
use queue_core::Result;
use sqlx::mysql::MySqlRow;
use sqlx::{MySqlPool, Row};
use uuid::Uuid;

use crate::error::SqlxResultExt;
use crate::sql::specialise;

const CREATE_HEAD: &str = "
INSERT IGNORE INTO `switchyard_jobs_status`
    (id, queue, kind, state, attempts, progress, created_at, updated_at) VALUES ";
const CREATE_ROW: &str = "(?, ?, ?, ?, ?, 0, {NOW}, {NOW})";

const CHANGE_HEAD: &str = "
INSERT INTO `switchyard_jobs_status`
    (id, queue, kind, state, attempts, progress, progress_message, result, last_error,
     runs, created_at, updated_at, finished_at) VALUES ";
const CHANGE_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW}, IF(?, {NOW}, NULL))";

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
    queue = IF(@ok, VALUES(queue), queue),
    kind = IF(@ok, VALUES(kind), kind),
    attempts = IF(@ok, VALUES(attempts), attempts),
    state = IF(@ok, VALUES(state), state)";
const OK: &str = "(VALUES(attempts) > attempts \
    OR (VALUES(attempts) = attempts AND state NOT IN ('completed', 'failed', 'dead')) \
    OR (VALUES(runs) = 1 AND state IN ('completed', 'failed', 'dead')))";

const RESET: &str = "
UPDATE `switchyard_jobs_status`
   SET state = 'pending', attempts = 0, progress = 0, progress_message = NULL, result = NULL,
       finished_at = NULL, version = version + 1, updated_at = {NOW}
 WHERE id = ? AND state IN ('failed', 'dead')";

const COLUMNS: &str = "id, queue, kind, state, CAST(attempts AS SIGNED) AS attempts, \
    CAST(coalesce(progress, 0) AS SIGNED) AS progress, progress_message, result, last_error, \
    version, created_at, updated_at, finished_at";

const PRUNE: &str = "
DELETE FROM `switchyard_jobs_status`
 WHERE finished_at IS NOT NULL AND finished_at < {NOW} - ? LIMIT 10000";

const THROUGHPUT: &str = "
SELECT queue, CAST(FLOOR(finished_at / ?) * ? AS SIGNED) AS bucket,
       CAST(SUM(state = 'completed') AS SIGNED) AS completed,
       CAST(SUM(state <> 'completed') AS SIGNED) AS failed
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
}

impl MySqlStatusStore {
    pub(crate) fn new(pool: MySqlPool, schema: Option<&str>, table: &str) -> Self {
        let s = |sql: &str| specialise(sql, schema, table);
        MySqlStatusStore {
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

#[async_trait]
impl StatusStore for MySqlStatusStore {
    async fn record(&self, updates: &[StatusUpdate]) -> Result<()> {
        let (creates, changes) = fold_updates(updates);
        if !creates.is_empty() {
            let sql = rows(&self.create_head, &self.create_row, creates.len());
            // One statement per batch size: not worth a slot in the statement cache.
            let mut q = sqlx::query(&sql).persistent(false);
            for u in &creates {
                q = q
                    .bind(u.id.to_string())
                    .bind(u.queue.as_str())
                    .bind(u.kind.as_str())
                    .bind(u.state.as_str())
                    .bind(i64::from(u.attempts));
            }
            q.execute(&self.pool).await.backend()?;
        }
        if !changes.is_empty() {
            let mut sql = rows(&self.change_head, &self.change_row, changes.len());
            sql.push_str(&self.change_tail);
            let mut q = sqlx::query(&sql).persistent(false);
            for u in &changes {
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
                    .bind(u.state.is_final());
            }
            q.execute(&self.pool).await.backend()?;
        }
        Ok(())
    }

    async fn reset(&self, ids: &[Uuid]) -> Result<u64> {
        let mut known = 0;
        for id in ids {
            known += sqlx::query(&self.reset)
                .bind(id.to_string())
                .execute(&self.pool)
                .await
                .backend()?
                .rows_affected();
        }
        Ok(known)
    }

    async fn get(&self, id: Uuid) -> Result<Option<JobStatus>> {
        let row = sqlx::query(&self.get)
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .backend()?;
        row.map(|r| raw(&r).backend()?.decode()).transpose()
    }

    async fn recent(&self, limit: usize) -> Result<Vec<JobStatus>> {
        let rows = sqlx::query(&self.recent)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter().map(|r| raw(r).backend()?.decode()).collect()
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        prune_in_slices(|| async {
            Ok(sqlx::query(&self.prune)
                .bind(micros(older_than))
                .execute(&self.pool)
                .await
                .backend()?
                .rows_affected())
        })
        .await
    }

    async fn throughput(&self, window: Duration, bucket: Duration) -> Result<Vec<Throughput>> {
        let bucket = micros(bucket).max(1);
        let rows = sqlx::query(&self.throughput)
            .bind(bucket)
            .bind(bucket)
            .bind(micros(window))
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                Ok(Throughput::from_row(
                    text(r, "queue").backend()?,
                    r.try_get("bucket").backend()?,
                    r.try_get("completed").backend()?,
                    r.try_get("failed").backend()?,
                ))
            })
            .collect()
    }
}
