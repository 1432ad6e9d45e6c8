//! [`JobLogStore`] for every SQL backend, over a backend's [`SqlRunner`]: one table
//! beside the queue's (`<table>_logs`), a row per job and attempt.

use async_trait::async_trait;
use chrono::DateTime;
use uuid::Uuid;

use super::dialect::Dialect;
use super::runner::{Bind, Kind, SqlRunner};
use crate::error::{DecodeError, Error, Result};
use crate::job_log::{JobLogStore, LogEntry};

const PUT: &str = "INSERT INTO \"switchyard_jobs_logs\" (id, attempt, body, updated_at)
    VALUES (?, ?, ?, ?){UPSERT}";
const GET: &str = "SELECT attempt, body, updated_at FROM \"switchyard_jobs_logs\"
    WHERE id = ? ORDER BY attempt";
const PRUNE: &str = "DELETE FROM \"switchyard_jobs_logs\" WHERE updated_at < ?";

/// The log table's statements.
#[derive(Debug, Clone)]
pub struct JobLogStatements {
    put: String,
    get: String,
    prune: String,
}

impl JobLogStatements {
    /// The statements in `dialect`, each through `specialise` (a backend's table name).
    pub fn new(dialect: Dialect, specialise: impl Fn(&str) -> String) -> Self {
        let upsert = match dialect {
            Dialect::MySql => {
                " ON DUPLICATE KEY UPDATE body = VALUES(body), updated_at = VALUES(updated_at)"
            }
            Dialect::Postgres | Dialect::Sqlite => {
                " ON CONFLICT (id, attempt) DO UPDATE SET body = excluded.body, \
                 updated_at = excluded.updated_at"
            }
        };
        let s = |sql: &str| specialise(&dialect.write(&sql.replace("{UPSERT}", upsert)));
        JobLogStatements {
            put: s(PUT),
            get: s(GET),
            prune: s(PRUNE),
        }
    }
}

/// The job logs of one SQL store.
#[derive(Debug)]
pub struct SqlJobLogs<R> {
    runner: R,
    sql: JobLogStatements,
}

impl<R: SqlRunner> SqlJobLogs<R> {
    /// The logs kept through `runner` by `sql`.
    pub fn new(runner: R, sql: JobLogStatements) -> Self {
        SqlJobLogs { runner, sql }
    }
}

#[async_trait]
impl<R: SqlRunner> JobLogStore for SqlJobLogs<R> {
    async fn put(&self, id: Uuid, attempt: u32, lines: &str, now: i64) -> Result<()> {
        let id = id.to_string();
        let binds = [
            Bind::Text(&id),
            Bind::Int(i64::from(attempt)),
            Bind::Text(lines),
            Bind::Int(now),
        ];
        self.runner.execute(&self.sql.put, &binds).await?;
        Ok(())
    }

    async fn get(&self, id: Uuid) -> Result<Vec<LogEntry>> {
        let key = id.to_string();
        let rows = self
            .runner
            .fetch(
                &self.sql.get,
                &[Bind::Text(&key)],
                &[Kind::Int, Kind::Text, Kind::Int],
            )
            .await?;
        rows.into_iter()
            .map(|row| {
                let mut cells = row.into_iter();
                let (Some(attempt), Some(lines), Some(at)) =
                    (cells.next(), cells.next(), cells.next())
                else {
                    return Err(bad(id, "a row without its three columns"));
                };
                let attempt = attempt.int("attempt")?;
                let at = at.int("updated_at")?;
                Ok(LogEntry {
                    attempt: u32::try_from(attempt)
                        .map_err(|_| bad(id, &format!("attempt {attempt}")))?,
                    lines: lines.text("body")?,
                    updated_at: DateTime::from_timestamp_micros(at)
                        .ok_or_else(|| bad(id, &format!("updated_at {at}")))?,
                })
            })
            .collect()
    }

    async fn prune(&self, before: i64) -> Result<u64> {
        self.runner
            .execute(&self.sql.prune, &[Bind::Int(before)])
            .await
    }
}

fn bad(id: Uuid, what: &str) -> Error {
    Error::Decode(DecodeError::new(format!("log row of job {id}: {what}")))
}
