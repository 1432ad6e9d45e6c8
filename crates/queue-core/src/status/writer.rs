//! The background writer: updates in batches, off the worker's hot path.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::StatusStore;
use super::update::StatusUpdate;
use crate::job_state::JobState;

/// How often a status batch is retried (backing off from 50 ms to 2 s, as acks are)
/// before its updates are written one by one.
const WRITE_RETRIES: u32 = 5;
/// The most updates written at once.
const WRITE_BATCH: usize = 512;
/// How long the writer gathers updates after the first of a batch arrives, so that a
/// batch carries more than one update. Followers see changes that much later.
const LINGER: Duration = Duration::from_millis(20);
/// How long a job's start (`running`) waits for its ending before it is written alone.
/// The ending comes once the job's ack commits, which under load is often after the
/// writer's next batch has gone: held back, most quick jobs' starts fold with their
/// endings, where two of every three were written on their own (measured on SQLite).
/// Followers see a job running up to that much later (plus the linger and the write),
/// and a job that ends within it never shows as running; its start time is kept.
const START_HOLD: Duration = Duration::from_millis(100);

/// An update and when it was sent.
type Stamped = (Instant, StatusUpdate);

/// Writes updates in the background, in batches: whatever arrives while one batch is
/// written forms the next.
#[derive(Debug, Clone)]
pub struct StatusWriter {
    tx: mpsc::UnboundedSender<Stamped>,
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
        let (tx, mut rx) = mpsc::unbounded_channel::<Stamped>();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let handle = tokio::spawn(async move {
            let mut batch: Vec<Stamped> = Vec::with_capacity(WRITE_BATCH);
            // Starts held back from earlier batches, oldest first.
            let mut held: Vec<Stamped> = Vec::new();
            loop {
                let due = held.first().map(|(at, _)| *at + START_HOLD);
                tokio::select! {
                    biased;
                    n = rx.recv_many(&mut batch, WRITE_BATCH) => {
                        if n == 0 {
                            break;
                        }
                        let until = Instant::now() + LINGER;
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
                    }
                    _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
                    _ = stopped.cancelled() => break,
                }
                let mut all = std::mem::take(&mut held);
                all.append(&mut batch);
                held = hold_starts(&mut all, Instant::now());
                write_stamped(store.as_ref(), all).await;
            }
            // Stopping: everything goes, held starts first.
            let mut all = std::mem::take(&mut held);
            all.append(&mut batch);
            while let Ok(update) = rx.try_recv() {
                all.push(update);
            }
            write_stamped(store.as_ref(), all).await;
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
        if self.tx.send((Instant::now(), update)).is_err() {
            tracing::warn!("the status writer stopped; a status update was dropped");
        }
    }
}

/// Takes out of `all` the starts sent less than [`START_HOLD`] before `now` that nothing
/// later in `all` follows, to be written with the next batch; keeps the order of both.
fn hold_starts(all: &mut Vec<Stamped>, now: Instant) -> Vec<Stamped> {
    let mut followed = HashSet::new();
    let mut held = Vec::new();
    let mut kept = Vec::with_capacity(all.len());
    for (at, u) in all.drain(..).rev() {
        let start = u.started && u.state == JobState::Running;
        if start && at + START_HOLD > now && !followed.contains(&u.id) {
            held.push((at, u));
        } else {
            followed.insert(u.id);
            kept.push((at, u));
        }
    }
    held.reverse();
    kept.reverse();
    *all = kept;
    held
}

/// Writes `all` in batches of at most [`WRITE_BATCH`]. A start written after it was
/// sent says how long before the write it began, so that its start time stays exact.
async fn write_stamped(store: &dyn StatusStore, all: Vec<Stamped>) {
    let updates: Vec<StatusUpdate> = all
        .into_iter()
        .map(|(at, mut u)| {
            if u.started && u.ran_for.is_none() {
                u.ran_for = Some(at.elapsed());
            }
            u
        })
        .collect();
    for chunk in updates.chunks(WRITE_BATCH) {
        write(store, chunk).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    fn env() -> Envelope {
        Envelope::builder("q", "k").build().expect("an envelope")
    }

    #[test]
    fn a_young_start_waits_for_its_ending_and_an_old_or_followed_one_does_not() {
        let now = Instant::now() + START_HOLD * 2;
        let young = now - START_HOLD / 2;
        let old = now - START_HOLD * 2;
        let (alone, ended, stale, other) = (env(), env(), env(), env());
        let mut all = vec![
            (young, StatusUpdate::published(&other)),
            (young, StatusUpdate::running(&alone, 1)),
            (young, StatusUpdate::running(&ended, 1)),
            (old, StatusUpdate::running(&stale, 1)),
            (young, StatusUpdate::completed(&ended, 1, None)),
            (young, StatusUpdate::progress(&other, 1, 10, None)),
        ];
        let held = hold_starts(&mut all, now);
        let ids = |v: &[Stamped]| v.iter().map(|(_, u)| (u.id, u.state)).collect::<Vec<_>>();
        assert_eq!(ids(&held), vec![(alone.id, JobState::Running)]);
        assert_eq!(
            ids(&all),
            vec![
                (other.id, JobState::Pending),
                (ended.id, JobState::Running),
                (stale.id, JobState::Running),
                (ended.id, JobState::Completed),
                (other.id, JobState::Running),
            ]
        );
    }
}
