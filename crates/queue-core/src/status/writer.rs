//! The background writer: updates in batches, off the worker's hot path.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::store::StatusStore;
use super::update::StatusUpdate;

/// How often a status batch is retried (backing off from 50 ms to 2 s, as acks are)
/// before its updates are written one by one.
const WRITE_RETRIES: u32 = 5;
/// The most updates written at once.
const WRITE_BATCH: usize = 512;
/// How long the writer gathers updates after the first of a batch arrives: a quick
/// job's `running` and `completed` then fold into one row write, which halves the
/// status writes of a busy queue. Followers see changes that much later.
const LINGER: Duration = Duration::from_millis(20);

/// Writes updates in the background, in batches: whatever arrives while one batch is
/// written forms the next.
#[derive(Debug, Clone)]
pub struct StatusWriter {
    tx: mpsc::UnboundedSender<StatusUpdate>,
    /// Names the worker on every update that does not name one.
    worker: Option<Arc<str>>,
}

/// Stops a [`StatusWriter`] once it has written everything sent before.
#[derive(Debug)]
pub struct StatusFlusher {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl StatusFlusher {
    /// Writes what is queued, then stops the writer.
    pub async fn finish(self) {
        self.stop.cancel();
        if self.handle.await.is_err() {
            tracing::error!("the status writer panicked; some status updates were lost");
        }
    }
}

impl StatusWriter {
    /// Starts the writer.
    pub fn spawn(store: Arc<dyn StatusStore>) -> (StatusWriter, StatusFlusher) {
        let (tx, mut rx) = mpsc::unbounded_channel::<StatusUpdate>();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let handle = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(WRITE_BATCH);
            loop {
                tokio::select! {
                    biased;
                    n = rx.recv_many(&mut batch, WRITE_BATCH) => {
                        if n == 0 {
                            return;
                        }
                        let until = tokio::time::Instant::now() + LINGER;
                        while batch.len() < WRITE_BATCH {
                            let room = WRITE_BATCH - batch.len();
                            tokio::select! {
                                biased;
                                n = rx.recv_many(&mut batch, room) => {
                                    if n == 0 {
                                        break;
                                    }
                                }
                                _ = tokio::time::sleep_until(until) => break,
                                _ = stopped.cancelled() => break,
                            }
                        }
                        write(store.as_ref(), &batch).await;
                        batch.clear();
                    }
                    _ = stopped.cancelled() => break,
                }
            }
            while let Ok(update) = rx.try_recv() {
                batch.push(update);
                if batch.len() >= WRITE_BATCH {
                    write(store.as_ref(), &batch).await;
                    batch.clear();
                }
            }
            if !batch.is_empty() {
                write(store.as_ref(), &batch).await;
            }
        });
        (
            StatusWriter { tx, worker: None },
            StatusFlusher { stop, handle },
        )
    }

    /// Names `worker` (`host:pid`) on every update sent that names none.
    pub fn for_worker(mut self, worker: &str) -> Self {
        self.worker = Some(Arc::from(worker));
        self
    }

    /// Queues an update.
    pub fn send(&self, mut update: StatusUpdate) {
        if update.worker.is_none() {
            update.worker = self.worker.as_deref().map(str::to_owned);
        }
        if self.tx.send(update).is_err() {
            tracing::warn!("the status writer stopped; a status update was dropped");
        }
    }
}

async fn write(store: &dyn StatusStore, batch: &[StatusUpdate]) {
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=WRITE_RETRIES {
        match store.record(batch).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(error = %err, attempt, size = batch.len(), "status write failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    // One update the store refuses (a result over MySQL's packet size, say) must not
    // take the rest of its batch down: write them one by one.
    let mut lost = 0;
    for update in batch {
        if let Err(err) = store.record(std::slice::from_ref(update)).await {
            lost += 1;
            tracing::error!(error = %err, id = %update.id, state = %update.state, "status update dropped; the job ran, its status is stale");
        }
    }
    if lost == 0 {
        tracing::info!(
            size = batch.len(),
            "status batch written one update at a time"
        );
    }
}
