//! The worker runtime: reserves in batches, runs handlers concurrently, extends leases
//! of long jobs, retries with backoff, coalesces acks, and shuts down gracefully.

mod acker;
mod counters;
mod deliver;
mod fetch;
mod handler;
mod options;
mod registration;
mod retry;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use counters::{WorkerCounters, WorkerReport};
pub use handler::{handler_fn, FnHandler, Handler, JobContext, JobError, JobResult};
pub use options::{UnknownKind, WorkerOptions};
pub use retry::RetryPolicy;

use crate::error::{Error, Result};
use crate::names::QueueName;
use crate::reservation::Reservation;
use crate::status::{Jobs, StatusStore, StatusUpdate, StatusWriter};
use crate::transport::Transport;
use crate::transport_ext::TransportExt;
use acker::Acker;
use fetch::{fetch_loop, give_back, wait_for_starting_claims, Claimed, DispatchState};

/// Start marks are written for up to this many times `concurrency` messages at once.
const START_GROUP: usize = 4;

/// The pause after a failed start (the store that marks starts refused), before the
/// next claim.
const START_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Runs handlers for the messages of one queue.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use queue_core::{QueueName, Transport};
/// use queue_core::worker::{handler_fn, JobContext, JobError, Worker, WorkerOptions};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(transport: Arc<dyn Transport>) -> queue_core::Result<()> {
/// let worker = Worker::new(transport, QueueName::new("emails")?, WorkerOptions::default())
///     .handle("send_welcome", handler_fn(|ctx: JobContext| async move {
///         let user: u64 = ctx.payload().map_err(|e| JobError::fail(e.to_string()))?;
///         println!("welcome, user {user}");
///         Ok(())
///     }));
/// let shutdown = CancellationToken::new(); // cancel it to stop gracefully
/// let report = worker.run(shutdown).await?;
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    transport: Arc<dyn Transport>,
    queue: QueueName,
    handlers: HashMap<String, Arc<dyn Handler>>,
    fallback: Option<Arc<dyn Handler>>,
    options: WorkerOptions,
    counters: Arc<WorkerCounters>,
    status: Option<Arc<dyn StatusStore>>,
    /// Set when the worker starts, if it records status.
    writer: OnceLock<StatusWriter>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("transport", &self.transport)
            .field("queue", &self.queue)
            .field("kinds", &self.handlers.keys().collect::<Vec<_>>())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker for `queue` over `transport`.
    pub fn new(transport: Arc<dyn Transport>, queue: QueueName, options: WorkerOptions) -> Self {
        Worker {
            transport,
            queue,
            handlers: HashMap::new(),
            fallback: None,
            options,
            counters: Arc::default(),
            status: None,
            writer: OnceLock::new(),
        }
    }

    /// A worker for `queue` over the transport of `jobs` that records job status in
    /// its store when it has one: the jobs it runs show on the dashboard and answer
    /// `publish --wait` and [`Jobs::publish_and_wait`] with no further step.
    pub fn for_jobs(jobs: &Jobs, queue: QueueName, options: WorkerOptions) -> Self {
        let worker = Worker::new(jobs.transport().clone(), queue, options);
        match jobs.store() {
            Some(store) => worker.with_status(store.clone()),
            None => worker,
        }
    }

    /// Records each job's status, progress and result in `store` (see
    /// [`crate::status`]): `running` as it starts, `completed` with its result once its
    /// ack has committed, `retrying`, `failed` or `dead` as it ends. Written in batches
    /// in the background.
    pub fn with_status(mut self, store: Arc<dyn StatusStore>) -> Self {
        self.status = Some(store);
        self
    }

    fn record(&self, update: impl FnOnce() -> StatusUpdate) {
        if let Some(writer) = self.writer.get() {
            writer.send(update());
        }
    }

    /// Registers the handler of `kind`.
    pub fn handle(mut self, kind: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(kind.into(), Arc::new(handler));
        self
    }

    /// Registers a handler for every kind without a handler of its own.
    pub fn handle_any(mut self, handler: impl Handler) -> Self {
        self.fallback = Some(Arc::new(handler));
        self
    }

    /// The live counters (clone the `Arc` before [`run`](Worker::run)).
    pub fn counters(&self) -> Arc<WorkerCounters> {
        self.counters.clone()
    }

    /// Runs until `shutdown` is cancelled (or, with `drain`, until the queue is empty),
    /// then stops reserving, lets in-flight handlers finish within the grace period,
    /// releases what is still unfinished so that it is delivered again at once, and
    /// flushes pending acks.
    ///
    /// Backend errors while reserving are logged and retried with backoff; they never
    /// stop the worker.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport> {
        self.run_until(shutdown, CancellationToken::new()).await
    }

    /// Like [`run`](Worker::run), and cancelling `abort` (a second Ctrl-C) cuts the
    /// grace period short: running handlers are cancelled and released at once.
    pub async fn run_until(
        self,
        shutdown: CancellationToken,
        abort: CancellationToken,
    ) -> Result<WorkerReport> {
        let worker = Arc::new(self);
        let opts = &worker.options;
        let concurrency = opts.concurrency.max(1);
        // Where the transport keeps its start marks in its status store, the jobs'
        // ends must be recorded there too, or their marks would read as crashes.
        if worker.status.is_none() && worker.transport.capabilities().start_marks_in_status {
            return Err(Error::Config(crate::error::ConfigError::new(
                "QUEUE_STATUS",
                None,
                format!(
                    "the {} transport keeps start marks in a status store: give the worker that store (Worker::with_status, or Worker::for_jobs with switchyard::connect_jobs)",
                    worker.transport.name()
                ),
            )));
        }
        let status = worker.status.clone();
        let label = crate::status::worker_label();
        let registry = status.clone().map(|store| {
            registration::Registration::start(
                store,
                worker.queue.as_str(),
                concurrency,
                worker.counters.clone(),
            )
        });
        let status_flusher = status.map(|store| {
            let (writer, flusher) = StatusWriter::spawn(store);
            let _ = worker.writer.set(writer.for_worker(&label));
            flusher
        });
        let (acker, flusher) = Acker::spawn(
            worker.transport.clone(),
            opts.ack_batch,
            worker.counters.clone(),
            worker.writer.get().cloned(),
        );
        let slots = Arc::new(Semaphore::new(concurrency));
        let hard_stop = CancellationToken::new();
        // Claims come in batches of at least `concurrency` into a buffer of twice that,
        // so a handler that finishes finds its next message waiting and one commit
        // claims many messages.
        // Each claimed message comes with when it was marked started, if its claim did.
        let (tx, mut rx) = mpsc::channel::<Claimed>(concurrency + opts.prefetch);
        let finished = Arc::new(tokio::sync::Notify::new());
        let dispatch = Arc::new(DispatchState::default());
        let (waiting, marked) = (&dispatch.waiting, &dispatch.marked);
        let fetcher = tokio::spawn(fetch_loop(
            worker.clone(),
            tx,
            shutdown.clone(),
            slots.clone(),
            acker.clone(),
            finished.clone(),
            dispatch.clone(),
        ));
        let mut tasks = JoinSet::new();
        // Messages marked started, with when, waiting for a slot.
        let mut next: std::collections::VecDeque<(Reservation, std::time::Instant)> =
            std::collections::VecDeque::new();
        // Claimed messages taken off the channel but not started yet, in order: a
        // suspect waiting for its turn to run alone, and what came in behind it.
        let mut stash: std::collections::VecDeque<Claimed> = std::collections::VecDeque::new();
        // Set while a suspect runs alone: nothing else starts until it has ended and its
        // settlement committed.
        let mut alone = false;
        tracing::info!(queue = %worker.queue, transport = worker.transport.name(), concurrency, "worker started");

        loop {
            while tasks.try_join_next().is_some() {}
            // A slot first, then the message (the drain check knows about the slot held
            // while waiting). While handlers are slow, only messages with a free slot are
            // marked started. While they are fast, a group is marked at once, ahead of its
            // slots, so one commit covers many starts: if the process dies, those waiting
            // are charged an attempt, but each at most once, because a message with
            // attempts > 0 (a suspect) only ever runs alone.
            let permit = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            if alone {
                // The suspect's own ack commits before anything else starts: should the
                // next one kill the process, the suspect is not charged again.
                if !settle_all(&mut tasks, &acker, &shutdown).await {
                    break;
                }
                alone = false;
                dispatch.quiet.store(false, Ordering::SeqCst);
            }
            if next.is_empty() {
                let first = match stash.pop_front() {
                    Some(r) => r,
                    None => {
                        waiting.store(true, Ordering::SeqCst);
                        let first = tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => None,
                            // None: the fetcher ended (queue drained, or told to stop).
                            r = rx.recv() => r,
                        };
                        waiting.store(false, Ordering::SeqCst);
                        let Some(first) = first else { break };
                        first
                    }
                };
                dispatch.stashed.store(stash.len(), Ordering::SeqCst);
                if first.1.is_none() && first.0.envelope.attempts > 0 {
                    // A message that failed or was reclaimed before: a possible poison.
                    // It runs alone, with nothing at stake: no other handler running,
                    // every ack committed, nothing else started, so that if it kills
                    // the process it charges only itself.
                    let (suspect, _) = first;
                    if worker.settle_on_arrival(&suspect).await {
                        dispatch.quiet.store(false, Ordering::SeqCst);
                        continue;
                    }
                    dispatch.quiet.store(true, Ordering::SeqCst);
                    // Claims that start messages as they claim them finish first; what
                    // they started runs before the suspect.
                    if !wait_for_starting_claims(&dispatch, &shutdown, &fetcher).await {
                        stash.push_front((suspect, None));
                        break;
                    }
                    while let Ok(claimed) = rx.try_recv() {
                        match claimed {
                            (r, Some(at)) => {
                                if !worker.settle_on_arrival(&r).await {
                                    next.push_back((r, at));
                                }
                            }
                            unstarted => stash.push_back(unstarted),
                        }
                    }
                    if next.is_empty() {
                        if !settle_all(&mut tasks, &acker, &shutdown).await {
                            stash.push_front((suspect, None));
                            break;
                        }
                        match worker
                            .transport
                            .start_batch(std::slice::from_ref(&suspect))
                            .await
                        {
                            Ok(report) if report.lost.contains(&suspect.id()) => {
                                worker.counters.lost.fetch_add(1, Ordering::Relaxed);
                                dispatch.quiet.store(false, Ordering::SeqCst);
                                tracing::warn!(message_id = %suspect.id(), "lease lost before the job started; skipped");
                            }
                            Ok(_) => {
                                tracing::debug!(message_id = %suspect.id(), attempts = suspect.envelope.attempts, "running a suspect alone");
                                next.push_back((suspect, std::time::Instant::now()));
                                alone = true;
                            }
                            Err(err) => {
                                dispatch.quiet.store(false, Ordering::SeqCst);
                                tracing::warn!(error = %err, "could not start a message; giving it back");
                                give_back(&worker, &suspect).await;
                                tokio::time::sleep(START_RETRY_PAUSE).await;
                            }
                        }
                    } else {
                        stash.push_front((suspect, None));
                    }
                    dispatch.stashed.store(stash.len(), Ordering::SeqCst);
                    marked.store(next.len(), Ordering::SeqCst);
                } else {
                    worker
                        .start_group(first, &mut rx, &mut stash, &mut next, &slots, &dispatch)
                        .await;
                }
            }
            let Some((r, marked_at)) = next.pop_front() else {
                continue;
            };
            marked.store(next.len(), Ordering::SeqCst);
            if shutdown.is_cancelled() {
                next.push_front((r, marked_at));
                break;
            }
            // A message that waited a good part of its lease for a slot is renewed first;
            // if another worker took it meanwhile, it is skipped, never run twice.
            let lease = r.lease;
            if marked_at.elapsed() >= lease / 3 {
                if let Err(err) = worker.transport.extend(&r, lease).await {
                    worker.log_settle_error("renew a waiting lease", &err);
                    continue;
                }
            }
            let (w, stop, acker, done, down) = (
                worker.clone(),
                hard_stop.clone(),
                acker.clone(),
                finished.clone(),
                shutdown.clone(),
            );
            tasks.spawn(async move {
                w.run_one(r, permit, stop, down, acker).await;
                done.notify_one();
            });
        }

        tracing::info!(queue = %worker.queue, in_flight = tasks.len(), "worker stopping");
        // Messages claimed but never started go back at once, without counting an attempt.
        rx.close();
        if fetcher.await.is_err() {
            tracing::error!("the fetcher panicked");
        }
        let unstarted: Vec<Reservation> = next
            .drain(..)
            .map(|(r, _)| r)
            .chain(stash.drain(..).map(|(r, _)| r))
            .collect();
        for r in unstarted {
            if let Err(err) = worker.transport.abandon(&r).await {
                worker.log_settle_error("give back", &err);
            }
        }
        while let Some((r, _)) = rx.recv().await {
            if let Err(err) = worker.transport.abandon(&r).await {
                worker.log_settle_error("give back", &err);
            }
        }
        let graceful = tokio::select! {
            done = tokio::time::timeout(opts.grace_period, async {
                while tasks.join_next().await.is_some() {}
            }) => done.is_ok(),
            _ = abort.cancelled() => false,
        };
        if !graceful {
            tracing::warn!(
                unfinished = tasks.len(),
                "grace period over: cancelling and releasing unfinished jobs"
            );
            hard_stop.cancel();
            while tasks.join_next().await.is_some() {}
        }
        drop(acker);
        if flusher.await.is_err() {
            tracing::error!(
                "the ack flusher panicked; unacknowledged messages will be delivered again"
            );
        }
        if let Some(flusher) = status_flusher {
            flusher.finish().await;
        }
        if let Some(registration) = registry {
            registration.finish().await;
        }
        let report = worker.counters.snapshot();
        tracing::info!(queue = %worker.queue, ?report, "worker stopped");
        Ok(report)
    }

    /// Starts `first` and the fresh messages behind it as one group: those their claim
    /// started already go straight to `next`; the rest are marked started here in one
    /// round trip. A suspect met on the way is stashed, to run alone in its turn.
    async fn start_group(
        &self,
        first: Claimed,
        rx: &mut mpsc::Receiver<Claimed>,
        stash: &mut std::collections::VecDeque<Claimed>,
        next: &mut std::collections::VecDeque<(Reservation, std::time::Instant)>,
        slots: &Semaphore,
        dispatch: &DispatchState,
    ) {
        let marked = &dispatch.marked;
        // While handlers are slow, only what free slots can start now is marked.
        let group = if self.counters.handlers_are_fast() {
            START_GROUP * self.options.concurrency.max(1)
        } else {
            slots.available_permits() + 1
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
            let following = match stash.pop_front() {
                Some(f) => Some(f),
                None => rx.try_recv().ok(),
            };
            item = match following {
                Some((f, None)) if f.envelope.attempts > 0 => {
                    stash.push_front((f, None));
                    None
                }
                other => other,
            };
        }
        dispatch.stashed.store(stash.len(), Ordering::SeqCst);
        for (r, at) in started {
            if !self.settle_on_arrival(&r).await {
                next.push_back((r, at));
            }
        }
        marked.store(next.len(), Ordering::SeqCst);
        let mut runnable = Vec::with_capacity(batch.len());
        for r in batch {
            if !self.settle_on_arrival(&r).await {
                runnable.push(r);
            }
        }
        if runnable.is_empty() {
            return;
        }
        // Mark them started (from now on a lapsed lease counts an attempt) and renew
        // their leases, which may have aged in the buffer.
        match self.transport.start_batch(&runnable).await {
            Ok(report) => {
                let at = std::time::Instant::now();
                for r in runnable {
                    if report.lost.contains(&r.id()) {
                        self.counters.lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(message_id = %r.id(), "lease lost before the job started; skipped");
                    } else {
                        next.push_back((r, at));
                        marked.store(next.len(), Ordering::SeqCst);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, count = runnable.len(), "could not start a batch; giving it back");
                for r in &runnable {
                    give_back(self, r).await;
                }
                // The store that marks starts is failing: not straight back into a claim
                // that would give the same messages back again.
                tokio::time::sleep(START_RETRY_PAUSE).await;
            }
        }
    }

    async fn queue_is_empty(&self) -> bool {
        match self.transport.stats(Some(&self.queue)).await {
            Ok(stats) => stats
                .iter()
                .filter(|s| s.queue == self.queue.as_str())
                .all(|s| s.ready + s.delayed + s.reserved == 0),
            Err(err) => {
                tracing::warn!(error = %err, "stats failed while checking for an empty queue");
                false
            }
        }
    }
}

/// Waits for every running handler to end and every queued ack to commit; `false` on
/// shutdown.
async fn settle_all(tasks: &mut JoinSet<()>, acker: &Acker, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => false,
        _ = async {
            while tasks.join_next().await.is_some() {}
            acker.flush().await;
        } => true,
    }
}
