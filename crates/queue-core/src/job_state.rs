//! Where a job is: the states of job status.

use std::fmt;

use serde::Serialize;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Published (or replayed), waiting for a worker.
    Pending,
    /// A handler is running it.
    Running,
    /// The handler succeeded and the message was acknowledged. Final.
    Completed,
    /// An attempt failed; it will run again after its backoff.
    Retrying,
    /// The handler said it cannot succeed ([`crate::worker::JobError::Fail`]); the
    /// message is in the dead-letter store. Final.
    Failed,
    /// Dead-lettered for any other reason: attempts exhausted, expired, no handler.
    /// Final.
    Dead,
    /// Cancelled by an operator ([`Controls::cancel`](crate::Controls::cancel),
    /// `switchyard cancel`): never run, or its handler cancelled; the message is gone.
    /// Final.
    Cancelled,
}

impl JobState {
    /// Every state, in the order a job usually passes through them.
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Running,
        JobState::Retrying,
        JobState::Completed,
        JobState::Failed,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Retrying => "retrying",
            JobState::Failed => "failed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the job has nothing more to do (until a dead letter is replayed).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Dead | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
