//! The dispatcher: takes claimed messages off the fetcher's channel, marks them started
//! (in groups while handlers are fast), runs a possible poison alone, and gives each a
//! handler task once a slot is free; at shutdown it gives back what never started.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::acker::Acker;
use super::builder::Worker;
use super::fetch::{give_back, wait_for_starting_claims, Claimed, DispatchState, Links};
use crate::reservation::Reservation;

/// Start marks are written for up to this many times `concurrency` messages at once.
const START_GROUP: usize = 4;

/// The pause after a failed start (the store that marks starts refused), before the
/// next claim.
const START_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// What the dispatch loop does next.
enum Flow {
    /// Run the next marked message, if there is one.
    Go,
    /// Start over: wait for a slot again.
    Again,
    /// Stop dispatching.
    Stop,
}

/// The dispatcher's state for one run.
pub(super) struct Dispatcher {
    worker: Arc<Worker>,
    rx: mpsc::Receiver<Claimed>,
    fetcher: JoinHandle<()>,
    slots: Arc<Semaphore>,
    acker: Acker,
    /// Told when a handler task ends: the fetcher has room to claim.
    finished: Arc<Notify>,
    dispatch: Arc<DispatchState>,
    shutdown: CancellationToken,
    /// Cancels running handlers once the grace period is over.
    hard_stop: CancellationToken,
    tasks: JoinSet<()>,
    /// Messages marked started, with when, waiting for a slot.
    next: VecDeque<(Reservation, Instant)>,
    /// Claimed messages taken off the channel but not started yet, in order: a suspect
    /// waiting for its turn to run alone, and what came in behind it.
    stash: VecDeque<Claimed>,
    /// Set while a suspect runs alone: nothing else starts until it has ended and its
    /// settlement committed.
    alone: bool,
}

impl Dispatcher {
    /// The dispatcher of a run: `rx` is the channel the fetcher (`task`) sends into.
    pub(super) fn new(links: Links, rx: mpsc::Receiver<Claimed>, task: JoinHandle<()>) -> Self {
        Dispatcher {
            worker: links.worker,
            rx,
            fetcher: task,
            slots: links.slots,
            acker: links.acker,
            finished: links.finished,
            dispatch: links.dispatch,
            shutdown: links.shutdown,
            hard_stop: CancellationToken::new(),
            tasks: JoinSet::new(),
            next: VecDeque::new(),
            stash: VecDeque::new(),
            alone: false,
        }
    }

    /// Dispatches until shutdown, or until the fetcher ends (the queue drained).
    ///
    /// A slot first, then the message (the drain check knows about the slot held while
    /// waiting). While handlers are slow, only messages with a free slot are marked
    /// started. While they are fast, a group is marked at once, ahead of its slots, so
    /// one commit covers many starts: if the process dies, those waiting are charged an
    /// attempt, but each at most once, because a message with attempts > 0 (a suspect)
    /// only ever runs alone.
    pub(super) async fn run(&mut self) {
        loop {
            while self.tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            if self.alone {
                // The suspect's own ack commits before anything else starts: should the
                // next one kill the process, the suspect is not charged again.
                if !self.settle_all().await {
                    break;
                }
                self.alone = false;
                self.dispatch.quiet.store(false, Ordering::SeqCst);
            }
            if self.next.is_empty() {
                match self.refill().await {
                    Flow::Go => {}
                    Flow::Again => continue,
                    Flow::Stop => break,
                }
            }
            let Some((r, marked_at)) = self.next.pop_front() else {
                continue;
            };
            self.dispatch
                .marked
                .store(self.next.len(), Ordering::SeqCst);
            if self.shutdown.is_cancelled() {
                self.next.push_front((r, marked_at));
                break;
            }
            self.spawn(r, marked_at, permit).await;
        }
    }

    /// Fills `next` from the stash or the channel: a suspect is prepared to run alone,
    /// anything else starts with the fresh messages behind it.
    async fn refill(&mut self) -> Flow {
        let first = match self.stash.pop_front() {
            Some(r) => r,
            None => {
                self.dispatch.waiting.store(true, Ordering::SeqCst);
                let first = tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => None,
                    // None: the fetcher ended (queue drained, or told to stop).
                    r = self.rx.recv() => r,
                };
                self.dispatch.waiting.store(false, Ordering::SeqCst);
                let Some(first) = first else {
                    return Flow::Stop;
                };
                first
            }
        };
        self.dispatch
            .stashed
            .store(self.stash.len(), Ordering::SeqCst);
        match first {
            // A message that failed or was reclaimed before: a possible poison.
            (suspect, None) if suspect.envelope.attempts > 0 => self.prepare_suspect(suspect).await,
            first => {
                self.start_group(first).await;
                Flow::Go
            }
        }
    }

    /// A suspect runs alone, with nothing at stake: no other handler running, every ack
    /// committed, nothing else started, so that if it kills the process it charges
    /// only itself.
    async fn prepare_suspect(&mut self, suspect: Reservation) -> Flow {
        if self.worker.settle_on_arrival(&suspect).await {
            self.dispatch.quiet.store(false, Ordering::SeqCst);
            return Flow::Again;
        }
        self.dispatch.quiet.store(true, Ordering::SeqCst);
        // Claims that start messages as they claim them finish first; what they started
        // runs before the suspect.
        if !wait_for_starting_claims(&self.dispatch, &self.shutdown, &self.fetcher).await {
            self.stash.push_front((suspect, None));
            return Flow::Stop;
        }
        while let Ok(claimed) = self.rx.try_recv() {
            match claimed {
                (r, Some(at)) => {
                    if !self.worker.settle_on_arrival(&r).await {
                        self.next.push_back((r, at));
                    }
                }
                unstarted => self.stash.push_back(unstarted),
            }
        }
        if self.next.is_empty() {
            if !self.settle_all().await {
                self.stash.push_front((suspect, None));
                return Flow::Stop;
            }
            self.start_suspect(suspect).await;
        } else {
            self.stash.push_front((suspect, None));
        }
        self.dispatch
            .stashed
            .store(self.stash.len(), Ordering::SeqCst);
        self.dispatch
            .marked
            .store(self.next.len(), Ordering::SeqCst);
        Flow::Go
    }

    /// Marks the suspect started, everything else being settled.
    async fn start_suspect(&mut self, suspect: Reservation) {
        let worker = &self.worker;
        match worker
            .transport
            .start_batch(std::slice::from_ref(&suspect))
            .await
        {
            Ok(report) if report.lost.contains(&suspect.id()) => {
                worker.counters.lost.fetch_add(1, Ordering::Relaxed);
                self.dispatch.quiet.store(false, Ordering::SeqCst);
                tracing::warn!(message_id = %suspect.id(), "lease lost before the job started; skipped");
            }
            Ok(_) => {
                tracing::debug!(message_id = %suspect.id(), attempts = suspect.envelope.attempts, "running a suspect alone");
                self.next.push_back((suspect, Instant::now()));
                self.alone = true;
            }
            Err(err) => {
                self.dispatch.quiet.store(false, Ordering::SeqCst);
                tracing::warn!(error = %err, "could not start a message; giving it back");
                give_back(worker, &suspect).await;
                tokio::time::sleep(START_RETRY_PAUSE).await;
            }
        }
    }

    /// Starts `first` and the fresh messages behind it as one group: those their claim
    /// started already go straight to `next`; the rest are marked started here in one
    /// round trip. A suspect met on the way is stashed, to run alone in its turn.
    async fn start_group(&mut self, first: Claimed) {
        let (started, batch) = self.gather_group(first);
        let worker = self.worker.clone();
        for (r, at) in started {
            if !worker.settle_on_arrival(&r).await {
                self.next.push_back((r, at));
            }
        }
        self.dispatch
            .marked
            .store(self.next.len(), Ordering::SeqCst);
        let mut runnable = Vec::with_capacity(batch.len());
        for r in batch {
            if !worker.settle_on_arrival(&r).await {
                runnable.push(r);
            }
        }
        if runnable.is_empty() {
            return;
        }
        // Mark them started (from now on a lapsed lease counts an attempt) and renew
        // their leases, which may have aged in the buffer.
        match worker.transport.start_batch(&runnable).await {
            Ok(report) => {
                let at = Instant::now();
                for r in runnable {
                    if report.lost.contains(&r.id()) {
                        worker.counters.lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(message_id = %r.id(), "lease lost before the job started; skipped");
                    } else {
                        self.next.push_back((r, at));
                        self.dispatch
                            .marked
                            .store(self.next.len(), Ordering::SeqCst);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, count = runnable.len(), "could not start a batch; giving it back");
                for r in &runnable {
                    give_back(&worker, r).await;
                }
                // The store that marks starts is failing: not straight back into a claim
                // that would give the same messages back again.
                tokio::time::sleep(START_RETRY_PAUSE).await;
            }
        }
    }

    /// Takes the group that starts with `first` off the stash and the channel: those
    /// their claim started, with when, and those still to mark.
    fn gather_group(&mut self, first: Claimed) -> (Vec<(Reservation, Instant)>, Vec<Reservation>) {
        // While handlers are slow, only what free slots can start now is marked.
        let group = if self.worker.counters.handlers_are_fast() {
            START_GROUP * self.worker.options.concurrency.max(1)
        } else {
            self.slots.available_permits() + 1
        };
        let mut started = Vec::new();
        let mut batch = Vec::new();
        let mut item = Some(first);
        while let Some((r, at)) = item.take() {
            match at {
                Some(at) => started.push((r, at)),
                None => batch.push(r),
            }
            if started.len() + batch.len() >= group {
                break;
            }
            let following = match self.stash.pop_front() {
                Some(f) => Some(f),
                None => self.rx.try_recv().ok(),
            };
            item = match following {
                Some((f, None)) if f.envelope.attempts > 0 => {
                    self.stash.push_front((f, None));
                    None
                }
                other => other,
            };
        }
        self.dispatch
            .stashed
            .store(self.stash.len(), Ordering::SeqCst);
        (started, batch)
    }

    /// Runs `r` in its own task. A message that waited a good part of its lease for a
    /// slot is renewed first; if another worker took it meanwhile, it is skipped, never
    /// run twice.
    async fn spawn(&mut self, r: Reservation, marked_at: Instant, permit: OwnedSemaphorePermit) {
        let lease = r.lease;
        if marked_at.elapsed() >= lease / 3 {
            if let Err(err) = self.worker.transport.extend(&r, lease).await {
                self.worker.log_settle_error("renew a waiting lease", &err);
                return;
            }
        }
        let (w, stop, acker, done, down) = (
            self.worker.clone(),
            self.hard_stop.clone(),
            self.acker.clone(),
            self.finished.clone(),
            self.shutdown.clone(),
        );
        // The run's future is large (about 5 KB: it holds every step a job can take),
        // and a task's future is copied as it is spawned: boxed, the task holds what it
        // captures and a pointer, and the run is copied once, into the heap.
        self.tasks.spawn(async move {
            Box::pin(w.run_one(r, permit, stop, down, acker)).await;
            done.notify_one();
        });
    }

    /// Waits for every running handler to end and every queued ack to commit; `false`
    /// on shutdown.
    async fn settle_all(&mut self) -> bool {
        let (tasks, acker) = (&mut self.tasks, &self.acker);
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => false,
            _ = async {
                while tasks.join_next().await.is_some() {}
                acker.flush().await;
            } => true,
        }
    }

    /// Stops: messages claimed but never started go back at once, without counting an
    /// attempt; running handlers get the grace period (cut short by `abort`), then are
    /// cancelled and released.
    pub(super) async fn finish(mut self, abort: CancellationToken) {
        let worker = self.worker.clone();
        tracing::info!(queue = %worker.queue, in_flight = self.tasks.len(), "worker stopping");
        self.rx.close();
        if (&mut self.fetcher).await.is_err() {
            tracing::error!("the fetcher panicked");
        }
        let unstarted: Vec<Reservation> = self
            .next
            .drain(..)
            .map(|(r, _)| r)
            .chain(self.stash.drain(..).map(|(r, _)| r))
            .collect();
        for r in unstarted {
            give_back(&worker, &r).await;
        }
        while let Some((r, _)) = self.rx.recv().await {
            give_back(&worker, &r).await;
        }
        let tasks = &mut self.tasks;
        let graceful = tokio::select! {
            done = tokio::time::timeout(worker.options.grace_period, async {
                while tasks.join_next().await.is_some() {}
            }) => done.is_ok(),
            _ = abort.cancelled() => false,
        };
        if !graceful {
            tracing::warn!(
                unfinished = self.tasks.len(),
                "grace period over: cancelling and releasing unfinished jobs"
            );
            self.hard_stop.cancel();
            while self.tasks.join_next().await.is_some() {}
        }
    }
}
