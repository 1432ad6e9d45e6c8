//! [`ScheduleStore`] for every SQL backend, over a backend's [`SqlRunner`]: one table
//! beside the queue's (`<table>_sched`), a row per schedule with its definition
//! (JSON), its pause and its cursor.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::runner::{Bind, Kind, SqlRunner};
use crate::error::Result;
use crate::schedule::{PutOutcome, ScheduleStore, StoredSchedule};

const ADD: &str = "INSERT {IGNORE}INTO \"switchyard_jobs_sched\"
    (name, spec, paused_at, fired_through, updated_at) VALUES (?, ?, 0, ?, ?){NOTHING}";
const CHANGE: &str = "UPDATE \"switchyard_jobs_sched\" SET spec = ?, updated_at = ?
    WHERE name = ? AND spec <> ?";
const REMOVE: &str = "DELETE FROM \"switchyard_jobs_sched\" WHERE name = ?";
const PAUSE: &str = "UPDATE \"switchyard_jobs_sched\" SET paused_at = ?, updated_at = ?
    WHERE name = ? AND paused_at = 0";
// The cursor never moves back: a resume by a host whose clock is behind keeps it.
const RESUME: &str = "UPDATE \"switchyard_jobs_sched\" SET paused_at = 0,
    fired_through = CASE WHEN fired_through < ? THEN ? ELSE fired_through END, updated_at = ?
    WHERE name = ? AND paused_at <> 0";
const LIST: &str = "SELECT name, spec, paused_at, fired_through
    FROM \"switchyard_jobs_sched\" ORDER BY name";
const ADVANCE: &str = "UPDATE \"switchyard_jobs_sched\" SET fired_through = ?
    WHERE name = ? AND fired_through = ?";

/// The schedule table's statements.
#[derive(Debug, Clone)]
pub struct ScheduleStatements {
    add: String,
    change: String,
    remove: String,
    pause: String,
    resume: String,
    list: String,
    advance: String,
}

impl ScheduleStatements {
    /// The statements in `dialect`, each through `specialise` (a backend's table name).
    pub fn new(dialect: Dialect, specialise: impl Fn(&str) -> String) -> Self {
        let s = |sql: &str| specialise(&dialect.write(sql));
        ScheduleStatements {
            add: s(ADD),
            change: s(CHANGE),
            remove: s(REMOVE),
            pause: s(PAUSE),
            resume: s(RESUME),
            list: s(LIST),
            advance: s(ADVANCE),
        }
    }
}

/// The schedules of one SQL store.
#[derive(Debug)]
pub struct SqlSchedules<R> {
    runner: R,
    sql: ScheduleStatements,
}

impl<R: SqlRunner> SqlSchedules<R> {
    /// The schedules kept through `runner` by `sql`.
    pub fn new(runner: R, sql: ScheduleStatements) -> Self {
        SqlSchedules { runner, sql }
    }
}

#[async_trait]
impl<R: SqlRunner> ScheduleStore for SqlSchedules<R> {
    async fn put(&self, name: &str, spec: &str, now: i64) -> Result<PutOutcome> {
        let added = self
            .runner
            .execute(
                &self.sql.add,
                &[
                    Bind::Text(name),
                    Bind::Text(spec),
                    Bind::Int(now),
                    Bind::Int(now),
                ],
            )
            .await?;
        if added > 0 {
            return Ok(PutOutcome::Added);
        }
        let changed = self
            .runner
            .execute(
                &self.sql.change,
                &[
                    Bind::Text(spec),
                    Bind::Int(now),
                    Bind::Text(name),
                    Bind::Text(spec),
                ],
            )
            .await?;
        Ok(if changed > 0 {
            PutOutcome::Changed
        } else {
            PutOutcome::Unchanged
        })
    }

    async fn remove(&self, name: &str) -> Result<bool> {
        Ok(self
            .runner
            .execute(&self.sql.remove, &[Bind::Text(name)])
            .await?
            > 0)
    }

    async fn set_paused(&self, name: &str, paused: bool, now: i64) -> Result<bool> {
        let changed = if paused {
            let binds = [Bind::Int(now), Bind::Int(now), Bind::Text(name)];
            self.runner.execute(&self.sql.pause, &binds).await?
        } else {
            let binds = [
                Bind::Int(now),
                Bind::Int(now),
                Bind::Int(now),
                Bind::Text(name),
            ];
            self.runner.execute(&self.sql.resume, &binds).await?
        };
        Ok(changed > 0)
    }

    async fn list(&self) -> Result<Vec<StoredSchedule>> {
        let rows = self
            .runner
            .fetch(
                &self.sql.list,
                &[],
                &[Kind::Text, Kind::Text, Kind::Int, Kind::Int],
            )
            .await?;
        rows.into_iter()
            .map(|row| {
                let mut cells = row.into_iter();
                let mut next = |column: &str| {
                    cells.next().ok_or_else(|| {
                        crate::Error::Conflict(format!(
                            "the schedule table returned no column {column}"
                        ))
                    })
                };
                Ok(StoredSchedule {
                    name: next("name")?.text("name")?,
                    spec: next("spec")?.text("spec")?,
                    paused: next("paused_at")?.int("paused_at")? != 0,
                    fired_through: next("fired_through")?.int("fired_through")?,
                })
            })
            .collect()
    }

    async fn advance(&self, name: &str, from: i64, to: i64) -> Result<bool> {
        let binds = [Bind::Int(to), Bind::Text(name), Bind::Int(from)];
        Ok(self.runner.execute(&self.sql.advance, &binds).await? > 0)
    }
}
