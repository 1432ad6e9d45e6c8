//! What an operator asks of job status beyond one record: a job's attempts, and jobs
//! listed by queue, state and search, with counts.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{DecodeError, Error, Result};
use crate::job_state::JobState;

/// One attempt of a job that ended without success (`retrying`, `failed` or `dead`).
/// The attempt that completed, or the one running now, is the job's record itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Attempt {
    /// Its number, 1 for the first.
    pub attempt: u32,
    /// How it ended.
    pub state: JobState,
    /// Why.
    pub error: Option<String>,
    /// The worker that ran it (`host:pid`), when a worker recorded it.
    pub worker: Option<String>,
    /// When its handler started, when known.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended (store clock).
    pub ended_at: DateTime<Utc>,
}

/// An attempt row as a SQL backend reads it (times in microseconds since the epoch).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct RawAttempt {
    pub id: String,
    pub attempt: i64,
    pub state: String,
    pub error: Option<String>,
    pub worker: Option<String>,
    pub started_at: Option<i64>,
    pub ended_at: i64,
}

impl RawAttempt {
    /// Decodes the row; a value no writer of this crate stores names its column.
    pub fn decode(self) -> Result<Attempt> {
        let bad = |column: &str, value: String| {
            Error::Decode(DecodeError::new(format!(
                "attempt row {:?}: column {column} holds {value:?}",
                self.id
            )))
        };
        let time = |column: &str, us: i64| {
            DateTime::from_timestamp_micros(us).ok_or_else(|| bad(column, us.to_string()))
        };
        Ok(Attempt {
            attempt: u32::try_from(self.attempt)
                .map_err(|_| bad("attempt", self.attempt.to_string()))?,
            state: JobState::parse(&self.state).ok_or_else(|| bad("state", self.state.clone()))?,
            started_at: self.started_at.map(|t| time("started_at", t)).transpose()?,
            ended_at: time("ended_at", self.ended_at)?,
            error: self.error.clone(),
            worker: self.worker.clone(),
        })
    }
}

/// Which jobs to list, newest change first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct JobFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<JobState>,
    /// Jobs whose id starts with this (case-insensitive), or whose kind is this.
    pub search: Option<String>,
    /// At most this many (capped at [`JobFilter::MAX_LIMIT`]).
    pub limit: usize,
    /// Skip this many first: the page.
    pub offset: usize,
}

impl JobFilter {
    /// The largest page.
    pub const MAX_LIMIT: usize = 500;

    /// Everything, `limit` at a time.
    pub fn new(limit: usize) -> Self {
        JobFilter {
            limit: limit.min(Self::MAX_LIMIT),
            ..JobFilter::default()
        }
    }

    /// Only `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only `state`.
    pub fn state(mut self, state: JobState) -> Self {
        self.state = Some(state);
        self
    }

    /// Ids starting with `text`, or the kind `text`.
    pub fn search(mut self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.search = (!text.trim().is_empty()).then(|| text.trim().to_owned());
        self
    }

    /// The page after skipping `offset` jobs.
    pub fn offset(mut self, offset: usize) -> Self {
        self.offset = offset;
        self
    }

    /// The limit and offset, for binding.
    pub fn page(&self) -> (i64, i64) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        (n(self.limit.min(Self::MAX_LIMIT)), n(self.offset))
    }

    /// The id prefix to match, lowercased and with `LIKE`'s wildcards taken literally
    /// (only hex digits and dashes can match an id anyway), for binding beside the kind.
    pub fn id_prefix(&self) -> Option<String> {
        self.search.as_ref().map(|s| {
            let kept: String = s
                .to_ascii_lowercase()
                .chars()
                .filter(|c| c.is_ascii_hexdigit() || *c == '-')
                .collect();
            // Nothing id-like: match no id (an empty prefix would match every one).
            if kept.is_empty() {
                "\u{1}".to_owned()
            } else {
                format!("{kept}%")
            }
        })
    }
}

/// How many jobs of one queue are in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StateCount {
    /// The queue.
    pub queue: String,
    /// The state.
    pub state: JobState,
    /// How many.
    pub count: u64,
}

impl StateCount {
    /// A count read from a row; `None` for a state no writer stores.
    pub fn from_row(queue: String, state: &str, count: i64) -> Option<Self> {
        Some(StateCount {
            queue,
            state: JobState::parse(state)?,
            count: u64::try_from(count).unwrap_or(0),
        })
    }
}
