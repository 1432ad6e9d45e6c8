//! A running worker reports itself to the status store: registered as it starts, a
//! heartbeat every few seconds with the jobs it has done, removed as it stops. Only for
//! the dashboard's list of workers: a store that fails is logged, never the worker's
//! problem.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::counters::WorkerCounters;
use crate::status::{StatusStore, WorkerInfo, HEARTBEAT_EVERY};

/// The heartbeat task of one worker run.
pub(crate) struct Registration {
    store: Arc<dyn StatusStore>,
    id: uuid::Uuid,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Registration {
    /// Starts the heartbeat, which also ends once `stop` is cancelled.
    pub(crate) fn start(
        store: Arc<dyn StatusStore>,
        queue: &str,
        concurrency: usize,
        counters: Arc<WorkerCounters>,
        stop: CancellationToken,
    ) -> Self {
        let info = WorkerInfo::this_process(queue, concurrency);
        let id = info.id;
        let task = tokio::spawn(beat(store.clone(), info, counters, stop.clone()));
        Registration {
            store,
            id,
            stop,
            task,
        }
    }

    /// Stops the heartbeat and removes the worker from the list.
    pub(crate) async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
        if let Err(err) = self.store.worker_stopped(self.id).await {
            tracing::debug!(error = %err, "could not remove this worker from the list of workers");
        }
    }
}

async fn beat(
    store: Arc<dyn StatusStore>,
    info: WorkerInfo,
    counters: Arc<WorkerCounters>,
    stop: CancellationToken,
) {
    let mut registered = false;
    loop {
        let done = counters.succeeded.load(Ordering::Relaxed)
            + counters.retried.load(Ordering::Relaxed)
            + counters.dead_lettered.load(Ordering::Relaxed);
        if registered {
            match store.worker_heartbeat(info.id, done).await {
                Ok(known) => registered = known,
                Err(err) => tracing::debug!(error = %err, "worker heartbeat not recorded"),
            }
        }
        if !registered {
            match store.register_worker(&info).await {
                Ok(()) => registered = true,
                Err(err) => {
                    tracing::debug!(error = %err, "could not add this worker to the list of workers")
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
        }
    }
}
