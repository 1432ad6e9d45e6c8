//! Helpers of the status cases: fresh queues and jobs, a store with its status, waiting
//! for a record.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::harness::{Harness, OpenOptions, Store};
use crate::status::{JobStatus, StatusStore};
use crate::worker::{RetryPolicy, Worker, WorkerOptions};
use crate::{Envelope, Error, QueueName, Result, Transport};

pub(super) fn fresh_queue() -> QueueName {
    QueueName::new(format!("s-{}", Uuid::new_v4().simple())).expect("a valid queue name")
}

pub(super) fn job(queue: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(queue.as_str(), kind)
        .build()
        .expect("a valid envelope")
}

pub(super) fn options(max_attempts: u32) -> WorkerOptions {
    WorkerOptions::default()
        .with_retry(RetryPolicy::new(
            Duration::from_millis(20),
            Duration::from_millis(40),
            max_attempts,
        ))
        .with_poll(Duration::from_millis(5), Duration::from_millis(50))
}

pub(super) struct Opened {
    pub(super) _store: Box<dyn Store>,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) status: Arc<dyn StatusStore>,
}

pub(super) async fn open(h: &Arc<dyn Harness>) -> Result<Opened> {
    let store = h.store().await?;
    let (transport, status) = store.open_with_status(OpenOptions::default()).await?;
    let status = status
        .ok_or_else(|| Error::NotSupported(format!("{} keeps no job status", transport.name())))?;
    Ok(Opened {
        _store: store,
        transport,
        status,
    })
}

/// Waits up to 10 s for the record of `id` to satisfy `done`.
pub(super) async fn until(
    status: &dyn StatusStore,
    id: Uuid,
    what: &str,
    done: impl Fn(&JobStatus) -> bool,
) -> Result<JobStatus> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        if let Some(s) = status.get(id).await? {
            if done(&s) {
                return Ok(s);
            }
            last = Some(s);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never became {what}; last seen {last:?}");
}

/// Runs `worker` until `stop` is cancelled.
pub(super) fn spawn(worker: Worker, stop: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let stop = stop.clone();
    tokio::spawn(async move {
        if let Err(err) = worker.run(stop).await {
            panic!("the worker failed: {err}");
        }
    })
}
