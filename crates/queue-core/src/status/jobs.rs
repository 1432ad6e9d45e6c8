//! Publishing with status kept, and request/reply on top of it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::follow::next_change;
use super::record::JobStatus;
use super::store::StatusStore;
use super::update::StatusUpdate;
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::job_state::JobState;
use crate::published::Published;
use crate::transport::Transport;

/// Why [`Jobs::publish_and_wait`] returned no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The job ended without a result: `failed` or `dead`.
    #[error("job {} ended {}: {}", .0.id, .0.state, .0.last_error.as_deref().unwrap_or("no error recorded"))]
    Failed(Box<JobStatus>),
    /// No final state within the timeout; the job may still run. `last` is what was
    /// recorded when the wait gave up.
    #[error("no answer from job {id} within {timeout:?} (last seen: {})", last.as_ref().map_or("nothing recorded", |s| s.state.as_str()))]
    TimedOut {
        /// The job.
        id: Uuid,
        /// How long the wait lasted.
        timeout: Duration,
        /// The record when it gave up.
        last: Option<Box<JobStatus>>,
    },
    /// Publishing or reading the status failed.
    #[error(transparent)]
    Queue(#[from] Error),
}

/// Publishes through a transport and keeps each job's status: what an application uses
/// to enqueue jobs it wants to follow, or wait for.
#[derive(Debug, Clone)]
pub struct Jobs {
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn StatusStore>>,
    tenant: Option<Arc<str>>,
}

impl Jobs {
    /// Over `transport`, recording status in `store` (`None`: publishing only).
    pub fn new(transport: Arc<dyn Transport>, store: Option<Arc<dyn StatusStore>>) -> Self {
        Jobs {
            transport,
            store,
            tenant: None,
        }
    }

    /// Names the tenant whose store `transport` opened (see [`crate::tenants`]): the
    /// label of the publish metrics, and what [`Jobs::tenant`] answers.
    pub fn with_tenant(mut self, tenant: Option<&str>) -> Self {
        self.tenant = tenant.map(Arc::from);
        self
    }

    /// The tenant, when there is one.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The status store, if any.
    pub fn store(&self) -> Option<&Arc<dyn StatusStore>> {
        self.store.as_ref()
    }

    fn require_store(&self) -> Result<&Arc<dyn StatusStore>> {
        self.store.as_ref().ok_or_else(|| {
            Error::NotSupported(
                "job status is off: it needs a SQL store (DATABASE_URL) and QUEUE_STATUS=on".into(),
            )
        })
    }

    /// Publishes one message, recorded `pending`; the outcome says when its unique key
    /// was held by another job.
    pub async fn publish(&self, envelope: Envelope) -> Result<Published> {
        self.publish_batch(vec![envelope]).await
    }

    /// Publishes messages, then records the stored ones `pending` (a duplicate of a
    /// unique key is not stored, so it gets no record). A worker quick enough to record
    /// `running` first keeps it (`pending` only ever creates a record). A failed status
    /// write is logged, not returned: the messages are stored, and a caller told
    /// otherwise would publish them again.
    pub async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        let mut updates: Vec<(Uuid, StatusUpdate)> = match &self.store {
            Some(_) => envelopes
                .iter()
                .map(|e| (e.id, StatusUpdate::published(e)))
                .collect(),
            None => Vec::new(),
        };
        let counts: Vec<(Uuid, String, String)> = envelopes
            .iter()
            .map(|e| (e.id, e.queue.to_string(), e.kind.clone()))
            .collect();
        let published = self.transport.publish_batch(envelopes).await?;
        let tenant = self.tenant.as_deref();
        for (id, queue, kind) in counts {
            match published.duplicate_of(id) {
                None => crate::metrics::published(tenant, &queue, &kind),
                Some(d) => crate::metrics::unique_conflict(tenant, &queue, &kind, d.replaced),
            }
        }
        if let Some(store) = &self.store {
            updates.retain(|(id, _)| published.duplicate_of(*id).is_none());
            let updates: Vec<StatusUpdate> = updates.into_iter().map(|(_, u)| u).collect();
            if let Err(err) = store.record(&updates).await {
                tracing::warn!(error = %err, count = updates.len(), "published, but their pending status was not recorded");
            }
        }
        Ok(published)
    }

    /// Replays the selected dead letters (see
    /// [`DeadLetters::dead_replay`](crate::DeadLetters::dead_replay)); a job replayed by
    /// id is `pending` again in the status store (its status said `dead`), and its
    /// cancellation mark, if one was left, is deleted first. A failed status write is
    /// logged: the message is back on its queue either way.
    pub async fn replay_dead(
        &self,
        queue: Option<&crate::names::QueueName>,
        selection: &crate::DeadSelection,
    ) -> Result<u64> {
        if let (crate::DeadSelection::Id(id), Some(store)) = (selection, &self.store) {
            if let (Ok(id), Some(controls)) = (Uuid::parse_str(id), store.controls()) {
                // A cancellation made as the job died (its worker never saw it) would
                // end the replay unrun: its status is `pending` again once replayed.
                // Only a dead job's: a live job's mark is an operator's cancel.
                let dead = store
                    .get(id)
                    .await?
                    .is_some_and(|s| matches!(s.state, JobState::Dead | JobState::Failed));
                if dead {
                    controls.forget(&[id]).await?;
                }
            }
        }
        let replayed = self.transport.dead_replay(queue, selection).await?;
        if let (crate::DeadSelection::Id(id), Some(store), true) =
            (selection, &self.store, replayed > 0)
        {
            if let Ok(id) = Uuid::parse_str(id) {
                if let Err(err) = store.reset(&[id]).await {
                    tracing::warn!(error = %err, %id, "replayed, but its status still says dead");
                }
            }
        }
        Ok(replayed)
    }

    /// The status of `id`.
    pub async fn status(&self, id: Uuid) -> Result<Option<JobStatus>> {
        self.require_store()?.get(id).await
    }

    /// Publishes `envelope` and waits up to `timeout` for its job to end: the handler's
    /// result (`null` when it returned none), or [`WaitError::Failed`] once it failed
    /// or died, or [`WaitError::TimedOut`]. Retries in between are waited through. A
    /// message whose unique key another job holds waits for that job instead. On
    /// PostgreSQL the wait is woken by `LISTEN/NOTIFY`; elsewhere it polls, from 10 ms
    /// backing off to 250 ms.
    pub async fn publish_and_wait(
        &self,
        envelope: Envelope,
        timeout: Duration,
    ) -> std::result::Result<Value, WaitError> {
        let store = self.require_store()?.clone();
        let mut id = envelope.id;
        // An id used before (a deterministic request id) may have an old answer on
        // record: only what changes after this publish is an answer to it.
        let mut version = store.get(id).await?.map_or(0, |s| s.version);
        let published = self.publish(envelope).await?;
        if let Some(dup) = published.duplicate_of(id) {
            // Its unique key's holder runs instead: its answer is this one's. (Changes
            // it made before are not waited for again: it is read from where it is.)
            id = dup.existing;
            version = 0;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            match next_change(store.as_ref(), id, version, deadline).await? {
                None => {
                    return Err(WaitError::TimedOut {
                        id,
                        timeout,
                        last: last.map(Box::new),
                    })
                }
                Some(status) => {
                    version = status.version;
                    match status.state {
                        JobState::Completed => return Ok(status.result.unwrap_or(Value::Null)),
                        JobState::Failed | JobState::Dead | JobState::Cancelled => {
                            return Err(WaitError::Failed(Box::new(status)))
                        }
                        _ => last = Some(status),
                    }
                }
            }
        }
    }
}
