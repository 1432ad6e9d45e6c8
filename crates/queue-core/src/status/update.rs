//! One change to a job's record, as the worker and the publisher make them.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::job_state::JobState;
use crate::text::bounded;
use crate::time_units::micros;

/// One change to record.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StatusUpdate {
    /// The message id.
    pub id: Uuid,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// The new state.
    pub state: JobState,
    /// The attempt this update belongs to: an update from an older attempt than the one
    /// recorded is ignored (a worker whose lease was lost cannot overwrite its
    /// successor).
    pub attempts: u32,
    /// New progress and note; `None` keeps what is recorded.
    pub progress: Option<(u8, Option<String>)>,
    /// The result (only with `completed`).
    pub result: Option<Value>,
    /// The failure (with `retrying`, `failed`, `dead`); `None` keeps the last one.
    pub error: Option<String>,
    /// Only creates the record: a message published again under a known id, or a
    /// publish that lost the race with its worker, changes nothing.
    pub create_only: bool,
    /// Begins a run of the job: the start of its attempt 1 (a new message under this
    /// id, or its dead letter replayed), or a batch's updates folded onto one. Such an
    /// update may replace a final state; the store counts the runs.
    pub starts_run: bool,
    /// The payload's JSON text (at most [`PAYLOAD_KEPT`] bytes), with `pending` and
    /// `running`; `None` keeps what is recorded.
    pub payload: Option<String>,
    /// The worker (`host:pid`) whose attempt this is; `None` keeps what is recorded.
    pub worker: Option<String>,
    /// Its attempt starts with this update (`running`).
    pub started: bool,
    /// How long its attempt's handler ran, with an ending: the attempt started that
    /// long before the update. With a start the writer held back, how long before the
    /// write it began.
    pub ran_for: Option<Duration>,
}

/// Most bytes of a payload that job status keeps (the queue keeps all of it).
pub const PAYLOAD_KEPT: usize = 16 * 1024;

/// Longest `last_error` kept, in bytes (its end, where the error usually is).
const ERROR_KEPT: usize = crate::text::ERROR_KEPT;
/// Longest progress note kept, in bytes.
const NOTE_KEPT: usize = 200;

impl StatusUpdate {
    /// Whether this begins a run of the job (see [`StatusUpdate::starts_run`]).
    pub fn is_first_start(&self) -> bool {
        self.starts_run
    }

    fn new(envelope: &Envelope, state: JobState, attempts: u32) -> Self {
        StatusUpdate {
            id: envelope.id,
            queue: envelope.queue.to_string(),
            kind: envelope.kind.clone(),
            state,
            attempts,
            progress: None,
            result: None,
            error: None,
            create_only: false,
            starts_run: false,
            payload: None,
            worker: None,
            started: false,
            ran_for: None,
        }
    }

    fn with_payload(mut self, envelope: &Envelope) -> Self {
        let text = envelope.payload.get();
        self.payload = Some(if text.len() <= PAYLOAD_KEPT {
            text.to_owned()
        } else {
            bounded(text, PAYLOAD_KEPT, false)
        });
        self
    }

    /// Names the worker whose attempt this is.
    pub fn by(mut self, worker: &str) -> Self {
        self.worker = Some(worker.to_owned());
        self
    }

    /// Says how long the attempt's handler ran (with an ending).
    pub fn after(mut self, ran_for: Duration) -> Self {
        self.ran_for = Some(ran_for);
        self
    }

    /// Published: `pending`, unless the id is known already (a worker may have
    /// recorded `running` first).
    pub fn published(envelope: &Envelope) -> Self {
        StatusUpdate {
            create_only: true,
            progress: Some((0, None)),
            ..Self::new(envelope, JobState::Pending, envelope.attempts)
        }
        .with_payload(envelope)
    }

    /// Attempt `attempt` started: `running`, progress back to 0.
    pub fn running(envelope: &Envelope, attempt: u32) -> Self {
        StatusUpdate {
            progress: Some((0, None)),
            starts_run: attempt == 1,
            started: true,
            ..Self::new(envelope, JobState::Running, attempt)
        }
        .with_payload(envelope)
    }

    /// The handler reported progress.
    pub fn progress(envelope: &Envelope, attempt: u32, percent: u8, note: Option<String>) -> Self {
        let note = Some(note.map_or_else(String::new, |n| bounded(&n, NOTE_KEPT, false)));
        StatusUpdate {
            progress: Some((percent.min(100), note)),
            ..Self::new(envelope, JobState::Running, attempt)
        }
    }

    /// Acknowledged, with the handler's result.
    pub fn completed(envelope: &Envelope, attempt: u32, result: Option<Value>) -> Self {
        StatusUpdate {
            progress: Some((100, None)),
            result,
            ..Self::new(envelope, JobState::Completed, attempt)
        }
    }

    /// Ended without a result: `retrying`, `failed` or `dead`, or `pending` when it was
    /// handed back unfinished at shutdown.
    pub fn ended(envelope: &Envelope, attempt: u32, state: JobState, error: Option<&str>) -> Self {
        StatusUpdate {
            error: error.map(|e| bounded(e, ERROR_KEPT, true)),
            ..Self::new(envelope, state, attempt)
        }
    }
}

impl StatusUpdate {
    /// The result as JSON text, for binding.
    pub fn result_text(&self) -> Option<String> {
        self.result.as_ref().map(Value::to_string)
    }

    /// The progress percentage, for binding (`None` keeps the recorded one).
    pub fn progress_percent(&self) -> Option<i64> {
        self.progress.as_ref().map(|(p, _)| i64::from(*p))
    }

    /// The progress note, for binding.
    pub fn progress_note(&self) -> Option<&str> {
        self.progress.as_ref().and_then(|(_, n)| n.as_deref())
    }

    /// How long before the write its attempt started, in microseconds, for binding:
    /// for a start, how long before the write it was sent (the status writer's stamp) or
    /// else 0; the handler's run time for an ending that knows it; `None` keeps the
    /// recorded start.
    pub fn started_ago_micros(&self) -> Option<i64> {
        match (self.ran_for, self.started) {
            (Some(d), _) => Some(micros(d)),
            (None, true) => Some(0),
            (None, false) => None,
        }
    }

    /// Whether this ends an attempt that did not succeed, which the store keeps among
    /// the job's attempts.
    pub fn ends_a_failed_attempt(&self) -> bool {
        matches!(
            self.state,
            JobState::Retrying | JobState::Failed | JobState::Dead
        )
    }
}

/// The endings of failed attempts in a batch, one per id and attempt (the first), taken
/// before the batch is folded, since folding keeps only the latest change of an id.
pub fn failed_attempts(updates: &[StatusUpdate]) -> Vec<StatusUpdate> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<StatusUpdate> = updates
        .iter()
        .filter(|u| u.ends_a_failed_attempt() && seen.insert((u.id, u.attempts)))
        .cloned()
        .collect();
    out.sort_by_key(|u| (u.id, u.attempts));
    out
}
