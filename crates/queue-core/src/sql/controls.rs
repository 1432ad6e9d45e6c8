//! The statements of [`Controls`](crate::Controls) in each SQL dialect: a table of paused
//! queues and kinds (`<table>_paused`, the whole queue as kind `''`) and one of
//! cancellation marks (`<table>_cancel`), both beside the queue's table.

use super::dialect::Dialect;

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
        }
    }
}
