//! [`CheckpointStore`] for every SQL backend, over a backend's [`SqlRunner`]: one table
//! beside the queue's (`<table>_ckpt`), a row per job with a checkpoint.
//!
//! A write is one statement that copies the job's id out of the row that fences it (the
//! job row with the run's lease token, or on RabbitMQ's control store the status row
//! with the run's start), locking that row as it reads it: a claim or start that
//! replaces the fence either waits for the write or makes it find nothing.

use async_trait::async_trait;
use uuid::Uuid;

use super::dialect::Dialect;
use super::runner::{Bind, Cell, Kind, SqlRunner};
use crate::checkpoint::{CheckpointStore, Fence};
use crate::error::Result;

const SAVE_LEASE: &str = "INSERT INTO \"switchyard_jobs_ckpt\" (id, value, updated_at)
    SELECT id, ?, ? FROM \"switchyard_jobs\" WHERE id = ? AND {TOKEN} = ?{SHARE}{UPSERT}";
const SAVE_START: &str = "INSERT INTO \"switchyard_jobs_ckpt\" (id, value, updated_at)
    SELECT id, ?, ? FROM \"switchyard_jobs_status\"
    WHERE id = ? AND state = 'running' AND attempts = ?{SHARE}{UPSERT}";
const HOLDS_LEASE: &str = "SELECT count(*) FROM \"switchyard_jobs\" WHERE id = ? AND {TOKEN} = ?";
const HOLDS_START: &str = "SELECT count(*) FROM \"switchyard_jobs_status\"
    WHERE id = ? AND state = 'running' AND attempts = ?";
const LOAD: &str = "SELECT value FROM \"switchyard_jobs_ckpt\" WHERE id = ?";
const CLEAR: &str = "DELETE FROM \"switchyard_jobs_ckpt\" WHERE id = ?";
const PRUNE: &str = "DELETE FROM \"switchyard_jobs_ckpt\" WHERE updated_at < ?";

/// The checkpoint table's statements.
#[derive(Debug, Clone)]
pub struct CheckpointStatements {
    save_lease: String,
    save_start: String,
    holds_lease: String,
    holds_start: String,
    load: String,
    clear: String,
    prune: String,
}

impl CheckpointStatements {
    /// The statements in `dialect`, each through `specialise` (a backend's table name).
    pub fn new(dialect: Dialect, specialise: impl Fn(&str) -> String) -> Self {
        // PostgreSQL's token is a uuid column, bound here as text.
        let (token, share, upsert) = match dialect {
            Dialect::Postgres => (
                "token::text",
                " FOR SHARE",
                " ON CONFLICT (id) DO UPDATE SET value = excluded.value, \
                 updated_at = excluded.updated_at",
            ),
            Dialect::MySql => (
                "token",
                " LOCK IN SHARE MODE",
                " ON DUPLICATE KEY UPDATE value = VALUES(value), updated_at = VALUES(updated_at)",
            ),
            // One writer at a time: the statement sees the fence as it commits.
            Dialect::Sqlite => (
                "token",
                "",
                " ON CONFLICT (id) DO UPDATE SET value = excluded.value, \
                 updated_at = excluded.updated_at",
            ),
        };
        let s = |sql: &str| {
            specialise(
                &dialect.write(
                    &sql.replace("{TOKEN}", token)
                        .replace("{SHARE}", share)
                        .replace("{UPSERT}", upsert),
                ),
            )
        };
        CheckpointStatements {
            save_lease: s(SAVE_LEASE),
            save_start: s(SAVE_START),
            holds_lease: s(HOLDS_LEASE),
            holds_start: s(HOLDS_START),
            load: s(LOAD),
            clear: s(CLEAR),
            prune: s(PRUNE),
        }
    }
}

/// The checkpoints of one SQL store.
#[derive(Debug)]
pub struct SqlCheckpoints<R> {
    runner: R,
    sql: CheckpointStatements,
}

impl<R: SqlRunner> SqlCheckpoints<R> {
    /// The checkpoints kept through `runner` by `sql`.
    pub fn new(runner: R, sql: CheckpointStatements) -> Self {
        SqlCheckpoints { runner, sql }
    }
}

#[async_trait]
impl<R: SqlRunner> CheckpointStore for SqlCheckpoints<R> {
    async fn save(&self, id: Uuid, fence: Fence, value: &str, now: i64) -> Result<bool> {
        let id = id.to_string();
        let token;
        let (save, holds, held_by) = match fence {
            Fence::Lease(t) => {
                token = t.0.to_string();
                (
                    &self.sql.save_lease,
                    &self.sql.holds_lease,
                    Bind::Text(&token),
                )
            }
            Fence::Start(attempt) => (
                &self.sql.save_start,
                &self.sql.holds_start,
                Bind::Int(i64::from(attempt)),
            ),
        };
        let binds = [Bind::Text(value), Bind::Int(now), Bind::Text(&id), held_by];
        if self.runner.execute(save, &binds).await? > 0 {
            return Ok(true);
        }
        // MySQL counts no row when the upsert changed nothing (the same value in the
        // same µs): the fence decides.
        let rows = self
            .runner
            .fetch(holds, &[Bind::Text(&id), held_by], &[Kind::Int])
            .await?;
        let held = rows
            .into_iter()
            .next()
            .and_then(|row| row.into_iter().next())
            .map(|cell| cell.int("count"))
            .transpose()?
            .unwrap_or(0);
        Ok(held > 0)
    }

    async fn load(&self, id: Uuid) -> Result<Option<String>> {
        let id = id.to_string();
        let rows = self
            .runner
            .fetch(&self.sql.load, &[Bind::Text(&id)], &[Kind::Text])
            .await?;
        rows.into_iter()
            .next()
            .and_then(|row| row.into_iter().next())
            .map(|cell: Cell| cell.text("value"))
            .transpose()
    }

    async fn clear(&self, id: Uuid) -> Result<()> {
        let id = id.to_string();
        self.runner
            .execute(&self.sql.clear, &[Bind::Text(&id)])
            .await?;
        Ok(())
    }

    async fn prune(&self, before: i64) -> Result<u64> {
        self.runner
            .execute(&self.sql.prune, &[Bind::Int(before)])
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_fences_and_upserts_its_own_way() {
        let pg = CheckpointStatements::new(Dialect::Postgres, str::to_owned);
        assert!(pg
            .save_lease
            .contains("token::text = $4 FOR SHARE ON CONFLICT"));
        let my = CheckpointStatements::new(Dialect::MySql, str::to_owned);
        assert!(my
            .save_start
            .contains("LOCK IN SHARE MODE ON DUPLICATE KEY"));
        assert!(my.load.contains("`switchyard_jobs_ckpt`"));
        let lite = CheckpointStatements::new(Dialect::Sqlite, str::to_owned);
        assert!(lite.save_lease.contains("token = ? ON CONFLICT (id)"));
    }
}
