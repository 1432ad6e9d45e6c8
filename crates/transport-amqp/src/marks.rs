//! Start marks in the control store: the SQL store beside the broker where each start is
//! recorded (the job's status `running` at its attempt) before its handler runs. The
//! broker cannot tell a delivery a handler started from one its consumer merely
//! prefetched; the marks can, so a delivery back from a closed channel is charged only
//! for a start that happened.

use queue_core::status::{JobState, StatusStore, StatusUpdate};
use queue_core::{Envelope, Result};

/// Records that `envelopes` start now, each at its next attempt; durable before any
/// handler runs, so a crash from then on charges exactly these.
pub(crate) async fn mark_started<'a>(
    store: &dyn StatusStore,
    envelopes: impl Iterator<Item = &'a Envelope>,
) -> Result<()> {
    let marks: Vec<StatusUpdate> = envelopes
        .map(|env| StatusUpdate::running(env, env.attempts + 1))
        .collect();
    if marks.is_empty() {
        return Ok(());
    }
    store.record(&marks).await
}

/// Closes the mark of a started message given back unrun (pending again, same
/// attempt), so that a later return of its copy is not charged for this start. A failure
/// is logged: at worst that later return is charged once.
pub(crate) async fn close_unrun(store: &dyn StatusStore, env: &Envelope) {
    let closed = StatusUpdate::ended(env, env.attempts + 1, JobState::Pending, None);
    if let Err(err) = store.record(&[closed]).await {
        tracing::warn!(message_id = %env.id, error = %err, "could not close the start mark of a message given back; a later return may be charged");
    }
}

/// The attempts to charge a message that came back from a closed channel: the start its
/// mark records (`running` at an attempt above the envelope's), or none. When the mark
/// cannot be read, one (at most `counted`, the broker's count), so that a poison still
/// ends but returns that never started are not all charged.
pub(crate) async fn charged_returns(store: &dyn StatusStore, env: &Envelope, counted: u32) -> u32 {
    match store.get(env.id).await {
        Ok(Some(status)) if status.state == JobState::Running && status.attempts > env.attempts => {
            status.attempts - env.attempts
        }
        Ok(_) => 0,
        Err(err) => {
            tracing::warn!(message_id = %env.id, error = %err, "could not read the start mark of a redelivered message; charging one attempt");
            counted.min(1)
        }
    }
}
