//! Coalesces the acks of concurrent handlers into batched acks: a commit per job would
//! cap a SQL backend at a few thousand jobs per second.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::WorkerCounters;
use crate::transport::{Reservation, Transport};

/// How often a failing ack batch is retried before it is left to the lease (the
/// messages are then delivered again: at-least-once, never lost).
const ACK_RETRIES: u32 = 5;

/// The sending side; dropping every clone flushes what is left and stops the flusher.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    tx: mpsc::UnboundedSender<(Reservation, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    capacity: usize,
}

impl Acker {
    /// Starts the flusher. At most `capacity` handled-but-unacknowledged messages are
    /// held in memory; a handler that finishes while they are waits for room.
    pub(crate) fn spawn(
        transport: Arc<dyn Transport>,
        capacity: usize,
        counters: Arc<WorkerCounters>,
    ) -> (Acker, JoinHandle<()>) {
        let capacity = capacity.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = tokio::spawn(flush_loop(transport, rx, capacity, counters));
        let acker = Acker {
            tx,
            room: Arc::new(Semaphore::new(capacity)),
            capacity,
        };
        (acker, handle)
    }

    /// Queues an ack.
    pub(crate) async fn ack(&self, reservation: Reservation) {
        let Ok(permit) = self.room.clone().acquire_owned().await else {
            return;
        };
        if self.tx.send((reservation, permit)).is_err() {
            tracing::error!("the ack flusher stopped; the message will be delivered again");
        }
    }

    /// Whether nothing is waiting to be acknowledged.
    pub(crate) fn is_idle(&self) -> bool {
        self.room.available_permits() == self.capacity
    }
}

async fn flush_loop(
    transport: Arc<dyn Transport>,
    mut rx: mpsc::UnboundedReceiver<(Reservation, OwnedSemaphorePermit)>,
    capacity: usize,
    counters: Arc<WorkerCounters>,
) {
    let mut pending = Vec::with_capacity(capacity);
    // Whatever arrives while a batch is being committed forms the next batch.
    while rx.recv_many(&mut pending, capacity).await > 0 {
        let (batch, permits): (Vec<Reservation>, Vec<OwnedSemaphorePermit>) =
            pending.drain(..).unzip();
        flush(transport.as_ref(), &batch, &counters).await;
        drop(permits);
    }
}

async fn flush(transport: &dyn Transport, batch: &[Reservation], counters: &WorkerCounters) {
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=ACK_RETRIES {
        match transport.ack_batch(batch).await {
            Ok(report) => {
                counters
                    .succeeded
                    .fetch_add(report.acked.len() as u64, Ordering::Relaxed);
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
