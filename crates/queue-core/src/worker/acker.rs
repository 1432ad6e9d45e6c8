//! Coalesces the acks of concurrent handlers into batched acks: a commit per job would
//! cap a SQL backend at a few thousand jobs per second.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use serde_json::Value;

use super::counters::WorkerCounters;
use crate::checkpoint::JobCheckpoint;
use crate::reservation::Reservation;
use crate::status::{StatusUpdate, StatusWriter};
use crate::transport::Transport;

/// How often a failing ack batch is retried before it is left to the lease (the
/// messages are then delivered again: at-least-once, never lost).
const ACK_RETRIES: u32 = 5;

/// The sending side; dropping every clone flushes what is left and stops the flusher.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    tx: mpsc::UnboundedSender<Handled>,
    room: Arc<Semaphore>,
    capacity: usize,
    /// Fires after each committed (or abandoned) batch.
    settled: Arc<Notify>,
}

impl Acker {
    /// Starts the flusher. At most `capacity` handled-but-unacknowledged messages are
    /// held in memory; a handler that finishes while they are waits for room.
    pub(crate) fn spawn(
        transport: Arc<dyn Transport>,
        capacity: usize,
        counters: Arc<WorkerCounters>,
        status: Option<StatusWriter>,
        tenant: Option<Arc<str>>,
    ) -> (Acker, JoinHandle<()>) {
        let capacity = capacity.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let settled = Arc::new(Notify::new());
        let handle = tokio::spawn(flush_loop(
            transport,
            rx,
            capacity,
            counters,
            status,
            tenant,
            settled.clone(),
        ));
        let acker = Acker {
            tx,
            room: Arc::new(Semaphore::new(capacity)),
            capacity,
            settled,
        };
        (acker, handle)
    }

    /// Queues an ack; what the handler `left` is settled once it commits (its result
    /// recorded with the `completed` status, with the handler's run time `ran_for`).
    pub(crate) async fn ack(&self, reservation: Reservation, left: Left, ran_for: Duration) {
        let Ok(permit) = self.room.clone().acquire_owned().await else {
            return;
        };
        if self
            .tx
            .send((reservation, (left, ran_for), permit))
            .is_err()
        {
            tracing::error!("the ack flusher stopped; the message will be delivered again");
        }
    }

    /// Whether nothing is waiting to be acknowledged.
    pub(crate) fn is_idle(&self) -> bool {
        self.room.available_permits() == self.capacity
    }

    /// Waits until every ack queued so far has been committed (or given up on), so that
    /// a crash from now on cannot charge those messages again.
    pub(crate) async fn flush(&self) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.is_idle() || self.tx.is_closed() {
                return;
            }
            settled.await;
        }
    }
}

/// A handled message waiting for its ack: the reservation, the handler's result and run
/// time, and its room in the acker.
type Handled = (Reservation, Done, OwnedSemaphorePermit);

/// What the handler left, and how long it ran.
type Done = (Left, Duration);

/// What a handler that succeeded leaves to settle once its ack commits.
#[derive(Debug, Default)]
pub(crate) struct Left {
    /// Its result, for the `completed` status.
    pub(crate) result: Option<Value>,
    /// The checkpoint it read or wrote, removed then.
    pub(crate) checkpoint: Option<JobCheckpoint>,
}

async fn flush_loop(
    transport: Arc<dyn Transport>,
    mut rx: mpsc::UnboundedReceiver<Handled>,
    capacity: usize,
    counters: Arc<WorkerCounters>,
    status: Option<StatusWriter>,
    tenant: Option<Arc<str>>,
    settled: Arc<Notify>,
) {
    let mut pending = Vec::with_capacity(capacity);
    // Whatever arrives while a batch is being committed forms the next batch.
    while rx.recv_many(&mut pending, capacity).await > 0 {
        let mut batch = Vec::with_capacity(pending.len());
        let mut results = Vec::with_capacity(pending.len());
        let mut permits = Vec::with_capacity(pending.len());
        for (r, result, permit) in pending.drain(..) {
            batch.push(r);
            results.push(result);
            permits.push(permit);
        }
        flush(
            transport.as_ref(),
            &batch,
            results,
            &counters,
            status.as_ref(),
            tenant.as_deref(),
        )
        .await;
        drop(permits);
        settled.notify_waiters();
    }
}

async fn flush(
    transport: &dyn Transport,
    batch: &[Reservation],
    results: Vec<Done>,
    counters: &WorkerCounters,
    status: Option<&StatusWriter>,
    tenant: Option<&str>,
) {
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=ACK_RETRIES {
        match transport.ack_batch(batch).await {
            Ok(report) => {
                counters
                    .succeeded
                    .fetch_add(report.acked.len() as u64, Ordering::Relaxed);
                // Only what committed is completed: a lost lease means another worker
                // runs the job again.
                let mut checkpoints = Vec::new();
                for (r, (left, ran_for)) in batch.iter().zip(results) {
                    if report.lost.contains(&r.id()) {
                        continue;
                    }
                    checkpoints.extend(left.checkpoint);
                    let result = left.result;
                    let env = &r.envelope;
                    crate::metrics::count(crate::metrics::ACKED, tenant, &env.queue, &env.kind, 1);
                    if let Some(status) = status {
                        status.send(
                            StatusUpdate::completed(env, env.attempts + 1, result).after(ran_for),
                        );
                    }
                }
                if !checkpoints.is_empty() {
                    tokio::spawn(async move {
                        for checkpoint in checkpoints {
                            checkpoint.clear().await;
                        }
                    });
                }
                if !report.lost.is_empty() {
                    counters
                        .lost
                        .fetch_add(report.lost.len() as u64, Ordering::Relaxed);
                    tracing::warn!(
                        count = report.lost.len(),
                        ids = ?report.lost,
                        "acks refused: the leases were lost, another worker has these messages"
                    );
                }
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, attempt, size = batch.len(), "ack batch failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    tracing::error!(
        size = batch.len(),
        "giving up on an ack batch; its messages will be delivered again when their leases run out"
    );
}
