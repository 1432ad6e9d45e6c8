//! One job as `switchyard job` and the dashboard's job page show it: its status record,
//! its failed attempts, and where it is now; or, without a record (status off, or
//! pruned), its dead letter if it has one.

use std::sync::Arc;

use serde::Serialize;
use switchyard::job_log::LogEntry;
use switchyard::status::Attempt;
use switchyard::{
    DeadLetter, Error, HeldSelection, Holding, JobState, JobStatus, Result, StatusStore, Transport,
};
use uuid::Uuid;

/// How many dead letters are searched for a job without a status record.
const DEAD_SEARCHED: usize = 10_000;

/// Everything known of one job.
#[derive(Debug, Serialize)]
pub(crate) struct JobView {
    /// The status record, when status is kept.
    pub(crate) status: Option<JobStatus>,
    /// Its failed attempts, oldest first.
    pub(crate) attempts: Vec<Attempt>,
    /// Where it is, in words.
    pub(crate) location: String,
    /// How long its latest attempt ran (to its end, or to now while it runs), in ms.
    pub(crate) duration_ms: Option<i64>,
    /// Its dead letter, when it has no record and is among the dead letters.
    pub(crate) dead_letter: Option<DeadLetter>,
    /// The dead letter's payload (not part of a dead letter's JSON).
    pub(crate) payload: Option<serde_json::Value>,
    /// Who holds it now, and until when, where the backend keeps holders.
    pub(crate) held: Option<Holding>,
    /// Its last checkpoint, where the store keeps them and it has one.
    pub(crate) checkpoint: Option<serde_json::Value>,
    /// The last lines each attempt wrote, oldest attempt first, where the store keeps
    /// job logs.
    pub(crate) logs: Vec<LogEntry>,
}

/// Looks `id` up: in `store` when there is one, else among the dead letters.
pub(crate) async fn find(
    transport: &Arc<dyn Transport>,
    store: Option<&Arc<dyn StatusStore>>,
    id: Uuid,
) -> Result<Option<JobView>> {
    let held = holding(transport, id).await?;
    let checkpoint = checkpoint(store, id).await?;
    let logs = match store.and_then(|s| s.job_logs()) {
        Some(logs) => logs.get(id).await?,
        None => Vec::new(),
    };
    if let Some(store) = store {
        if let Some(status) = store.get(id).await? {
            let attempts = store.attempts(id).await?;
            let location = match &held {
                Some(h) => held_location(h, transport.name()),
                None => location(&status, transport.name()),
            };
            let duration_ms = status.started_at.map(|start| {
                let end = status.finished_at.unwrap_or_else(chrono::Utc::now);
                (end - start).num_milliseconds().max(0)
            });
            let payload = status.payload.clone();
            return Ok(Some(JobView {
                status: Some(status),
                attempts,
                location,
                duration_ms,
                dead_letter: None,
                payload,
                held,
                checkpoint,
                logs,
            }));
        }
    }
    if let Some(h) = held {
        return Ok(Some(JobView {
            status: None,
            attempts: Vec::new(),
            location: held_location(&h, transport.name()),
            duration_ms: None,
            dead_letter: None,
            payload: None,
            held: Some(h),
            checkpoint,
            logs,
        }));
    }
    let key = id.to_string();
    let dead = transport
        .dead_list(None, DEAD_SEARCHED)
        .await?
        .into_iter()
        .find(|d| d.id == key);
    Ok(dead.map(|d| JobView {
        status: None,
        attempts: Vec::new(),
        location: format!(
            "a dead letter of queue {} ({}); replay it with `switchyard dead replay --id {key}`",
            d.queue,
            transport.name()
        ),
        duration_ms: None,
        payload: d.envelope.as_ref().map(crate::payload::payload_value),
        dead_letter: Some(d),
        held: None,
        checkpoint,
        logs,
    }))
}

/// The job's checkpoint, where `store` keeps them (text that is not JSON shows as a
/// string).
async fn checkpoint(
    store: Option<&Arc<dyn StatusStore>>,
    id: Uuid,
) -> Result<Option<serde_json::Value>> {
    let Some(checkpoints) = store.and_then(|s| s.checkpoints()) else {
        return Ok(None);
    };
    Ok(checkpoints
        .load(id)
        .await?
        .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))))
}

/// The holding of `id`, where the backend keeps holders (RabbitMQ does not).
async fn holding(transport: &Arc<dyn Transport>, id: Uuid) -> Result<Option<Holding>> {
    if !transport.capabilities().holders {
        return Ok(None);
    }
    match transport.held(HeldSelection::Id(&id.to_string()), 1).await {
        Ok(mut held) => Ok(held.pop()),
        Err(Error::NotSupported(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

fn held_location(h: &Holding, backend: &str) -> String {
    format!(
        "held by {} until {} (queue {}, {backend})",
        h.holder.as_deref().unwrap_or("an unnamed claim"),
        h.lease_until
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        h.queue
    )
}

fn location(s: &JobStatus, backend: &str) -> String {
    let on = |what: &str| format!("{what} in queue {} ({backend})", s.queue);
    match s.state {
        JobState::Pending => on("waiting"),
        JobState::Retrying => on("waiting for its next attempt"),
        JobState::Running => match &s.worker {
            Some(w) => format!("running on worker {w} (queue {})", s.queue),
            None => on("running"),
        },
        JobState::Completed => "done: acknowledged and removed from its queue".to_owned(),
        JobState::Cancelled => "cancelled: removed from its queue".to_owned(),
        JobState::Failed | JobState::Dead => format!(
            "a dead letter of queue {} ({backend}); replay it with `switchyard dead replay --id {}`",
            s.queue, s.id
        ),
    }
}
