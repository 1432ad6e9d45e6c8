//! [`Controls`] in SQL, written once: the statements in each dialect and the store over a
//! backend's runner. A table of paused queues and kinds (`<table>_paused`, the whole
//! queue as kind `''`) and one of cancellation marks (`<table>_cancel`), both beside the
//! queue's table.

use async_trait::async_trait;
use uuid::Uuid;

use super::dialect::Dialect;
use super::runner::{Bind, Cell, Kind, SqlRunner};
use crate::controls::{Controls, Paused};
use crate::error::{Error, Result};

/// The control tables' statements in one dialect, for the default table name: a
/// backend specialises them for its table as it does its own.
#[derive(Debug, Clone)]
pub struct ControlStatements {
    /// Pauses (queue, kind).
    pub pause: String,
    /// Resumes (queue, kind).
    pub resume: String,
    /// Every pause: queue, kind.
    pub paused: String,
    /// Marks a job cancelled (id).
    pub cancel: String,
    /// The marks: id.
    pub cancelled: String,
    /// How many marks, and the newest one's time: whether they changed.
    pub marks: String,
    /// Deletes a mark (id).
    pub forget: String,
    /// Whether a job is marked (id).
    pub marked: String,
}

const PAUSE: &str = "INSERT {IGNORE}INTO \"switchyard_jobs_paused\" (queue, kind, paused_at)
    VALUES (?, ?, {NOW}){NOTHING}";
const RESUME: &str = "DELETE FROM \"switchyard_jobs_paused\" WHERE queue = ? AND kind = ?";
const PAUSED: &str = "SELECT queue, kind FROM \"switchyard_jobs_paused\" ORDER BY queue, kind";
const CANCEL: &str = "INSERT {IGNORE}INTO \"switchyard_jobs_cancel\" (id, marked_at)
    VALUES (?, {NOW}){NOTHING}";
const CANCELLED: &str = "SELECT id FROM \"switchyard_jobs_cancel\" LIMIT 100000";
const MARKS: &str = "SELECT COUNT(*), COALESCE(MAX(marked_at), 0) FROM \"switchyard_jobs_cancel\"";
const FORGET: &str = "DELETE FROM \"switchyard_jobs_cancel\" WHERE id = ?";
const MARKED: &str = "SELECT id FROM \"switchyard_jobs_cancel\" WHERE id = ?";

impl ControlStatements {
    /// The statements in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        let s = |sql: &str| dialect.write(sql);
        ControlStatements {
            pause: s(PAUSE),
            resume: s(RESUME),
            paused: s(PAUSED),
            cancel: s(CANCEL),
            cancelled: s(CANCELLED),
            marks: s(MARKS),
            forget: s(FORGET),
            marked: s(MARKED),
        }
    }

    /// Each statement through `f` (a backend's table specialisation).
    pub fn map(self, f: impl Fn(&str) -> String) -> Self {
        ControlStatements {
            pause: f(&self.pause),
            resume: f(&self.resume),
            paused: f(&self.paused),
            cancel: f(&self.cancel),
            cancelled: f(&self.cancelled),
            marks: f(&self.marks),
            forget: f(&self.forget),
            marked: f(&self.marked),
        }
    }
}

/// The pauses and cancellation marks of one table of jobs, kept through a backend's
/// [`SqlRunner`].
#[derive(Debug)]
pub struct SqlControls<R> {
    runner: R,
    sql: ControlStatements,
}

impl<R: SqlRunner> SqlControls<R> {
    /// The controls kept through `runner` by `sql`.
    pub fn new(runner: R, sql: ControlStatements) -> Self {
        SqlControls { runner, sql }
    }
}

#[async_trait]
impl<R: SqlRunner> Controls for SqlControls<R> {
    async fn pause(&self, queue: &str, kind: Option<&str>) -> Result<()> {
        let binds = [Bind::Text(queue), Bind::Text(kind.unwrap_or_default())];
        self.runner
            .execute(&self.sql.pause, &binds)
            .await
            .map(|_| ())
    }

    async fn resume(&self, queue: &str, kind: Option<&str>) -> Result<bool> {
        let binds = [Bind::Text(queue), Bind::Text(kind.unwrap_or_default())];
        Ok(self.runner.execute(&self.sql.resume, &binds).await? > 0)
    }

    async fn paused(&self) -> Result<Vec<Paused>> {
        let rows = self
            .runner
            .fetch(&self.sql.paused, &[], &[Kind::Text, Kind::Text])
            .await?;
        rows.into_iter()
            .map(|row| {
                let mut cells = row.into_iter();
                let queue = next_text(&mut cells, "queue")?;
                let kind = next_text(&mut cells, "kind")?;
                Ok(Paused {
                    queue,
                    kind: (!kind.is_empty()).then_some(kind),
                })
            })
            .collect()
    }

    async fn cancel(&self, ids: &[Uuid]) -> Result<()> {
        for id in ids {
            let id = id.to_string();
            self.runner
                .execute(&self.sql.cancel, &[Bind::Text(&id)])
                .await?;
        }
        Ok(())
    }

    async fn cancelled(&self) -> Result<Vec<Uuid>> {
        let rows = self
            .runner
            .fetch(&self.sql.cancelled, &[], &[Kind::Text])
            .await?;
        // A mark that is not a job id marks nothing a worker could meet.
        Ok(rows
            .into_iter()
            .filter_map(|row| next_text(&mut row.into_iter(), "id").ok())
            .filter_map(|id| Uuid::parse_str(&id).ok())
            .collect())
    }

    async fn marks(&self) -> Result<(u64, i64)> {
        let rows = self
            .runner
            .fetch(&self.sql.marks, &[], &[Kind::Int, Kind::Int])
            .await?;
        let row = rows.first().ok_or_else(|| {
            Error::Conflict("counting the cancellation marks returned no row".into())
        })?;
        let count = cell(row, 0, "COUNT(*)")?.int("COUNT(*)")?;
        let newest = cell(row, 1, "marked_at")?.int("marked_at")?;
        Ok((u64::try_from(count).unwrap_or(0), newest))
    }

    async fn is_marked(&self, id: Uuid) -> Result<bool> {
        let id = id.to_string();
        let rows = self
            .runner
            .fetch(&self.sql.marked, &[Bind::Text(&id)], &[Kind::Text])
            .await?;
        Ok(!rows.is_empty())
    }

    async fn forget(&self, ids: &[Uuid]) -> Result<()> {
        for id in ids {
            let id = id.to_string();
            self.runner
                .execute(&self.sql.forget, &[Bind::Text(&id)])
                .await?;
        }
        Ok(())
    }
}

/// The next cell of a row, as text.
fn next_text(cells: &mut impl Iterator<Item = Cell>, column: &str) -> Result<String> {
    cells
        .next()
        .ok_or_else(|| Error::Conflict(format!("a control row has no column {column}")))?
        .text(column)
}

/// Cell `i` of a row.
fn cell<'a>(row: &'a [Cell], i: usize, column: &str) -> Result<&'a Cell> {
    row.get(i)
        .ok_or_else(|| Error::Conflict(format!("a control row has no column {column}")))
}
