//! What the store knows of one job, and its row before decoding.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::job_state::JobState;

/// What the store knows of one job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// The message id.
    pub id: Uuid,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Where it is.
    pub state: JobState,
    /// Deliveries so far (the attempt running now included).
    pub attempts: u32,
    /// 0–100, as the handler last reported it (100 once completed).
    pub progress: u8,
    /// The handler's short note beside its progress.
    pub progress_message: Option<String>,
    /// The handler's result, once completed.
    pub result: Option<Value>,
    /// The last failure.
    pub last_error: Option<String>,
    /// Counts the changes to this record: a reader that saw version `v` has seen every
    /// change up to it.
    pub version: u64,
    /// When it was first recorded.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it reached a final state.
    pub finished_at: Option<DateTime<Utc>>,
    /// The payload, as recorded when it was published or first run (at most
    /// [`PAYLOAD_KEPT`](crate::status::PAYLOAD_KEPT) bytes of it; a longer one is kept as the text of its start).
    pub payload: Option<Value>,
    /// The worker that runs or ran its latest attempt (`host:pid`).
    pub worker: Option<String>,
    /// When its latest attempt started.
    pub started_at: Option<DateTime<Utc>>,
}

/// A status row as a SQL backend reads it, before decoding (times in microseconds
/// since the Unix epoch).
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct RawStatus {
    pub id: String,
    pub queue: String,
    pub kind: String,
    pub state: String,
    pub attempts: i64,
    pub progress: i64,
    pub progress_message: Option<String>,
    pub result: Option<String>,
    pub last_error: Option<String>,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub payload: Option<String>,
    pub worker: Option<String>,
    pub started_at: Option<i64>,
}

impl RawStatus {
    /// Decodes the row; a value no writer of this crate stores is a decode error that
    /// names the column.
    pub fn decode(self) -> Result<JobStatus> {
        let bad = |column: &str, value: &str| {
            Error::Decode(crate::error::DecodeError::new(format!(
                "status row {:?}: column {column} holds {value:?}",
                self.id
            )))
        };
        let time = |column: &str, us: i64| {
            DateTime::from_timestamp_micros(us).ok_or_else(|| bad(column, &us.to_string()))
        };
        Ok(JobStatus {
            id: Uuid::parse_str(&self.id).map_err(|_| bad("id", &self.id))?,
            state: JobState::parse(&self.state).ok_or_else(|| bad("state", &self.state))?,
            attempts: u32::try_from(self.attempts)
                .map_err(|_| bad("attempts", &self.attempts.to_string()))?,
            progress: u8::try_from(self.progress.clamp(0, 100)).unwrap_or(0),
            // A result that is not JSON (written by hand, say) is shown as its text.
            result: self
                .result
                .as_deref()
                .map(|r| serde_json::from_str(r).unwrap_or_else(|_| Value::String(r.to_owned()))),
            version: u64::try_from(self.version)
                .map_err(|_| bad("version", &self.version.to_string()))?,
            created_at: time("created_at", self.created_at)?,
            updated_at: time("updated_at", self.updated_at)?,
            finished_at: self
                .finished_at
                .map(|t| time("finished_at", t))
                .transpose()?,
            started_at: self.started_at.map(|t| time("started_at", t)).transpose()?,
            payload: self
                .payload
                .as_deref()
                .map(|p| serde_json::from_str(p).unwrap_or_else(|_| Value::String(p.to_owned()))),
            worker: self.worker.clone(),
            queue: self.queue.clone(),
            kind: self.kind.clone(),
            progress_message: self.progress_message.clone(),
            last_error: self.last_error.clone(),
        })
    }
}
