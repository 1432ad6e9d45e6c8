//! The worker runtime: reserves in batches, runs handlers concurrently, extends leases
//! of long jobs, retries with backoff, coalesces acks, and shuts down gracefully.

mod acker;
mod handler;
mod retry;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use handler::{handler_fn, FnHandler, Handler, JobContext, JobError, JobResult};
pub use retry::RetryPolicy;

use crate::error::{Error, Result};
use crate::names::QueueName;
use crate::reason;
use crate::status::{JobState, StatusStore, StatusUpdate, StatusWriter};
use crate::transport::{Reservation, Transport};
use acker::Acker;
use handler::Report;

/// What the worker does with a message whose kind has no handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnknownKind {
    /// Dead-letter it with reason `no_handler` (the default).
    #[default]
    DeadLetter,
    /// Release it after this delay, for a newer worker that knows the kind.
    Release(Duration),
}

/// Options of a [`Worker`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Handlers running at once.
    pub concurrency: usize,
    /// Messages claimed ahead of free handlers while handlers are fast (under 10 ms on
    /// average, that is at most about 256 × 10 ms / concurrency of work), so that one
    /// commit claims many messages. Their claim marks fresh ones started (see
    /// [`Transport::prefetch_batch_starting_fresh`]): if the worker dies, each is charged
    /// one attempt, never more. While handlers are slow nothing is prefetched, leaving the
    /// rest to other workers. Default 256.
    pub prefetch: usize,
    /// When to retry and how often.
    pub retry: RetryPolicy,
    /// A handler running longer is cancelled, and that counts as a failure.
    pub timeout: Option<Duration>,
    /// On shutdown, how long in-flight handlers may take before they are cancelled and
    /// their messages released.
    pub grace_period: Duration,
    /// The first pause after an empty reserve; doubles up to `poll_max`.
    pub poll_min: Duration,
    /// The longest pause between polls of an empty queue.
    pub poll_max: Duration,
    /// The most handled-but-unacknowledged messages held in memory; acks are committed
    /// in batches of up to this many.
    pub ack_batch: usize,
    /// Messages with an unknown kind.
    pub unknown_kind: UnknownKind,
    /// Exit once nothing is ready, delayed or reserved on the queue and nothing is in
    /// flight here (batch use and tests).
    pub drain: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 8,
            prefetch: 256,
            retry: RetryPolicy::default(),
            timeout: None,
            grace_period: Duration::from_secs(30),
            poll_min: Duration::from_millis(20),
            poll_max: Duration::from_secs(1),
            ack_batch: 256,
            unknown_kind: UnknownKind::DeadLetter,
            drain: false,
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency (at least 1).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sets how many messages may be claimed ahead of free handlers.
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the handler timeout.
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the shutdown grace period.
    pub fn with_grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Sets the polling pauses of an idle worker.
    pub fn with_poll(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min;
        self.poll_max = max.max(min);
        self
    }

    /// Sets the ack batch.
    pub fn with_ack_batch(mut self, n: usize) -> Self {
        self.ack_batch = n.max(1);
        self
    }

    /// Sets what happens to unknown kinds.
    pub fn with_unknown_kind(mut self, unknown: UnknownKind) -> Self {
        self.unknown_kind = unknown;
        self
    }

    /// Exits once the queue is empty.
    pub fn with_drain(mut self, drain: bool) -> Self {
        self.drain = drain;
        self
    }
}

/// Live counts of a worker, readable while it runs (for progress bars and metrics).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct WorkerCounters {
    /// Messages handled and acknowledged.
    pub succeeded: AtomicU64,
    /// Failed deliveries released for a retry.
    pub retried: AtomicU64,
    /// Messages moved to the dead-letter store.
    pub dead_lettered: AtomicU64,
    /// Deliveries whose lease was lost (another worker has the message).
    pub lost: AtomicU64,
    /// Unfinished messages released at shutdown.
    pub released_on_shutdown: AtomicU64,
    /// Handlers running now.
    pub in_flight: AtomicU64,
    /// Moving average of handler run time, in microseconds.
    handler_micros: AtomicU64,
}

/// Start marks are written for up to this many times `concurrency` messages at once.
const START_GROUP: usize = 4;

/// The pause after a failed start (the store that marks starts refused), before the
/// next claim.
const START_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How long a cancelled handler may take to notice its token before it is aborted.
const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// Above this average run time handlers count as slow and nothing is prefetched.
const FAST_HANDLER: Duration = Duration::from_millis(10);

impl WorkerCounters {
    fn record_duration(&self, d: Duration) {
        let sample = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let old = self.handler_micros.load(Ordering::Relaxed);
        // An exponential moving average over about eight jobs.
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.handler_micros.store(new, Ordering::Relaxed);
    }

    /// Until the first job has finished, handlers count as slow: nothing is prefetched
    /// for jobs that may take minutes.
    fn handlers_are_fast(&self) -> bool {
        let avg = self.handler_micros.load(Ordering::Relaxed);
        avg > 0 && u128::from(avg) < FAST_HANDLER.as_micros()
    }
}

/// A snapshot of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Messages handled and acknowledged.
    pub succeeded: u64,
    /// Failed deliveries released for a retry.
    pub retried: u64,
    /// Messages moved to the dead-letter store.
    pub dead_lettered: u64,
    /// Deliveries whose lease was lost.
    pub lost: u64,
    /// Unfinished messages released at shutdown.
    pub released_on_shutdown: u64,
}

impl WorkerCounters {
    /// The counts now.
    pub fn snapshot(&self) -> WorkerReport {
        WorkerReport {
            succeeded: self.succeeded.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            released_on_shutdown: self.released_on_shutdown.load(Ordering::Relaxed),
        }
    }
}

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

/// What ended one handler run.
enum Ending {
    Finished(JobResult),
    Panicked(String),
    TimedOut(Duration),
    LeaseLost,
    ShutDown,
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
        let status = worker.status.clone().or_else(|| {
            worker
                .transport
                .capabilities()
                .start_marks_in_status
                .then(|| worker.transport.status_store())
                .flatten()
        });
        let status_flusher = status.map(|store| {
            let (writer, flusher) = StatusWriter::spawn(store);
            let _ = worker.writer.set(writer);
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
            let lease = worker.transport.visibility_timeout();
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

    async fn run_one(
        self: Arc<Self>,
        reservation: Reservation,
        permit: OwnedSemaphorePermit,
        hard_stop: CancellationToken,
        shutdown: CancellationToken,
        acker: Acker,
    ) {
        let env = &reservation.envelope;
        // At WARN so that the message's fields reach even a warnings-only log.
        let span = tracing::warn_span!(
            "job",
            message_id = %env.id,
            kind = %env.kind,
            attempt = env.attempts + 1,
            trace_id = env.trace_id.as_deref().unwrap_or(""),
            queue = %env.queue,
        );
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        self.clone()
            .deliver(reservation, hard_stop, shutdown, acker)
            .instrument(span)
            .await;
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        drop(permit);
    }

    /// Settles a message that must not run: expired (where the transport does not
    /// filter expiry itself), out of attempts, or of an unknown kind. `true` when settled.
    async fn settle_on_arrival(&self, r: &Reservation) -> bool {
        let env = &r.envelope;
        let max_attempts = self.options.retry.max_attempts_for(env);
        if !self.transport.capabilities().expiry && env.is_expired_at(chrono::Utc::now()) {
            self.dead_letter(
                r,
                env.attempts,
                reason::EXPIRED,
                "expired before it could be handled",
            )
            .await;
            return true;
        }
        if env.attempts >= max_attempts {
            // Reclaims after lost leases count as attempts: a message that kills or hangs
            // its worker every time ends here instead of looping forever.
            let why = env.last_error.clone().unwrap_or_else(|| {
                format!(
                    "{} deliveries ended without an ack (the worker died or hung)",
                    env.attempts
                )
            });
            self.dead_letter(r, env.attempts, reason::MAX_ATTEMPTS, &why)
                .await;
            return true;
        }
        if !self.handlers.contains_key(&env.kind) && self.fallback.is_none() {
            let why = format!("no handler for kind {:?} on this worker", env.kind);
            match self.options.unknown_kind {
                UnknownKind::DeadLetter => {
                    self.dead_letter(r, env.attempts, reason::NO_HANDLER, &why)
                        .await
                }
                UnknownKind::Release(delay) => {
                    self.release(r, env.attempts, JobState::Pending, delay, &why)
                        .await
                }
            }
            return true;
        }
        false
    }

    async fn deliver(
        self: Arc<Self>,
        r: Reservation,
        hard_stop: CancellationToken,
        shutdown: CancellationToken,
        acker: Acker,
    ) {
        let env = &r.envelope;
        let max_attempts = self.options.retry.max_attempts_for(env);
        let Some(handler) = self
            .handlers
            .get(&env.kind)
            .or(self.fallback.as_ref())
            .cloned()
        else {
            return;
        };

        let cancel = hard_stop.child_token();
        let attempt = env.attempts + 1;
        // A transport that marks starts in the status store has recorded this one.
        if !self.transport.capabilities().start_marks_in_status {
            self.record(|| StatusUpdate::running(env, attempt));
        }
        let report = Report {
            writer: self.writer.get().cloned(),
            result: Arc::default(),
        };
        let result = report.result.clone();
        let ctx = JobContext {
            envelope: env.clone(),
            attempt,
            max_attempts,
            lease_token: r.token(),
            cancel: cancel.clone(),
            shutdown,
            report,
        };
        let started = std::time::Instant::now();
        // Its own task, so that a panic is caught as a JoinError.
        let mut job = tokio::spawn(
            async move { handler.handle(ctx).await }.instrument(tracing::Span::current()),
        );
        let lease = self.transport.visibility_timeout();
        let every = (lease / 3).max(Duration::from_millis(10));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let deadline = self
            .options
            .timeout
            .map(|t| tokio::time::Instant::now() + t);
        let mut ending = loop {
            tokio::select! {
                // A job that finished wins over a timeout or shutdown at the same instant.
                biased;
                joined = &mut job => break match joined {
                    Ok(result) => Ending::Finished(result),
                    Err(e) if e.is_panic() => Ending::Panicked(panic_message(e.into_panic())),
                    Err(_) => Ending::ShutDown,
                },
                _ = sleep_until(deadline) => break Ending::TimedOut(self.options.timeout.unwrap_or_default()),
                _ = cancel.cancelled() => break Ending::ShutDown,
                // The heartbeat: only jobs that outlive a third of the lease pay for it.
                _ = beat.tick() => match self.transport.extend(&r, lease).await {
                    Ok(()) => tracing::trace!("lease extended"),
                    Err(err) if err.is_lease_lost() => {
                        tracing::warn!("heartbeat found the lease lost; cancelling the handler");
                        break Ending::LeaseLost;
                    }
                    Err(err) => tracing::warn!(error = %err, "heartbeat failed; retrying at the next beat"),
                },
            }
        };
        // The token fires first; a handler that watches it gets a moment to stop cleanly
        // before it is aborted.
        cancel.cancel();
        if !job.is_finished() {
            let late = tokio::time::timeout(CANCEL_GRACE, &mut job).await;
            job.abort();
            // A job that completes cleanly once told to stop at shutdown is done.
            if let (Ending::ShutDown, Ok(Ok(Ok(())))) = (&ending, &late) {
                ending = Ending::Finished(Ok(()));
            }
        }
        // A job that failed because the grace period ran out was stopped by us: it goes
        // back for immediate redelivery, not through the retry backoff.
        if hard_stop.is_cancelled()
            && matches!(ending, Ending::Finished(Err(_)) | Ending::Panicked(_))
        {
            ending = Ending::ShutDown;
        }
        let elapsed = started.elapsed();
        self.counters.record_duration(elapsed);
        crate::metrics::handler_duration(&env.queue, &env.kind, elapsed);
        match ending {
            Ending::Finished(Ok(())) => {
                tracing::debug!(?elapsed, "handled");
                let result = result.lock().ok().and_then(|mut slot| slot.take());
                acker.ack(r, result).await;
            }
            Ending::Finished(Err(JobError::Fail { message })) => {
                tracing::warn!(error = %message, "handler failed for good");
                self.dead_letter(&r, attempt, reason::FAILED, &message)
                    .await;
            }
            Ending::Finished(Err(JobError::Retry { message, after })) => {
                self.failed(&r, max_attempts, &message, after).await;
            }
            Ending::Panicked(message) => {
                let message = format!("handler panicked: {message}");
                self.failed(&r, max_attempts, &message, None).await;
            }
            Ending::TimedOut(limit) => {
                let message = format!("handler timed out after {limit:?}");
                self.failed(&r, max_attempts, &message, None).await;
            }
            Ending::LeaseLost => {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "lease lost while handling: another worker has the message; stopped"
                );
            }
            Ending::ShutDown => {
                match self
                    .transport
                    .release(
                        &r,
                        Duration::ZERO,
                        Some("the worker shut down before the job finished"),
                    )
                    .await
                {
                    Ok(()) => {
                        self.counters
                            .released_on_shutdown
                            .fetch_add(1, Ordering::Relaxed);
                        self.record(|| StatusUpdate::ended(env, attempt, JobState::Pending, None));
                    }
                    Err(err) => self.log_settle_error("release at shutdown", &err),
                }
            }
        }
    }

    /// A failed delivery: released with backoff, or dead-lettered once the attempts ran
    /// out.
    async fn failed(
        &self,
        r: &Reservation,
        max_attempts: u32,
        message: &str,
        after: Option<Duration>,
    ) {
        let failures = r.envelope.attempts + 1;
        if failures >= max_attempts {
            tracing::info!(error = %message, failures, "attempts exhausted");
            self.dead_letter(r, failures, reason::MAX_ATTEMPTS, message)
                .await;
        } else {
            let delay = after.unwrap_or_else(|| self.options.retry.backoff(failures));
            tracing::info!(error = %message, retry_in = ?delay, "handler failed; will retry");
            self.release(r, failures, JobState::Retrying, delay, message)
                .await;
        }
    }

    /// Releases `r` after `delay`; its status becomes `state` (`retrying` after a
    /// failure, `pending` when it was never run).
    async fn release(
        &self,
        r: &Reservation,
        attempt: u32,
        state: JobState,
        delay: Duration,
        message: &str,
    ) {
        match self.transport.release(r, delay, Some(message)).await {
            Ok(()) => {
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
                let env = &r.envelope;
                crate::metrics::count(crate::metrics::RELEASED, &env.queue, &env.kind, 1);
                self.record(|| StatusUpdate::ended(env, attempt, state, Some(message)));
            }
            Err(err) => self.log_settle_error("release", &err),
        }
    }

    async fn dead_letter(&self, r: &Reservation, attempt: u32, why: &str, message: &str) {
        match self.transport.dead_letter(r, why, Some(message)).await {
            Ok(()) => {
                self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reason = why, error = %message, "dead-lettered");
                let env = &r.envelope;
                crate::metrics::dead_lettered(&env.queue, &env.kind, why);
                let state = if why == reason::FAILED {
                    JobState::Failed
                } else {
                    JobState::Dead
                };
                self.record(|| StatusUpdate::ended(env, attempt, state, Some(message)));
            }
            Err(err) => self.log_settle_error("dead-letter", &err),
        }
    }

    fn log_settle_error(&self, what: &str, err: &Error) {
        if err.is_lease_lost() {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{what} refused: the lease was lost, another worker has the message");
        } else {
            tracing::error!(error = %err, "{what} failed; the message will be delivered again when its lease runs out");
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What the dispatcher tells the fetcher about the messages it holds.
#[derive(Debug, Default)]
struct DispatchState {
    /// Set while the dispatcher holds a free slot and waits for a message.
    waiting: AtomicBool,
    /// Marked messages waiting for a slot: the fetcher counts them as buffered.
    marked: AtomicUsize,
    /// Claimed messages the dispatcher holds back behind a suspect: buffered too.
    stashed: AtomicUsize,
    /// Set while a suspect waits to run or runs alone: claims start nothing then.
    quiet: AtomicBool,
    /// Claims in flight that start fresh messages as they claim them, until what they
    /// brought is in the channel.
    starting: AtomicUsize,
}

/// Counts a starting claim as done when dropped: after its messages were sent into the
/// channel, or when it brought none.
struct StartingClaim<'a> {
    dispatch: &'a DispatchState,
    starts: bool,
}

impl Drop for StartingClaim<'_> {
    fn drop(&mut self) {
        if self.starts {
            self.dispatch.starting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Waits until no claim that starts messages is in flight (their messages are then in
/// the channel); `false` on shutdown.
async fn wait_for_starting_claims(
    dispatch: &DispatchState,
    shutdown: &CancellationToken,
    fetcher: &tokio::task::JoinHandle<()>,
) -> bool {
    while dispatch.starting.load(Ordering::SeqCst) > 0 {
        if shutdown.is_cancelled() {
            return false;
        }
        // A fetcher that ended (or panicked) brings nothing more.
        if fetcher.is_finished() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
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

/// What one claim brought back: messages, each with whether the claim started it.
type ClaimOutcome = Result<Vec<(Reservation, bool)>>;

/// A claimed message, with when its claim marked it started (`None`: not started yet).
type Claimed = (Reservation, Option<std::time::Instant>);

/// Claims batches into the buffer while there is room; backs off while the queue is
/// empty and wakes at once on the transport's signal. Ends on shutdown, or in drain
/// mode once the queue is empty and nothing is in flight.
///
/// One claim is in flight at a time while the queue is idle; while it has a backlog (the
/// last claim came back full) and handlers are fast, a second claim overlaps the first, so
/// handlers do not wait out a whole round trip between batches.
async fn fetch_loop(
    worker: Arc<Worker>,
    tx: mpsc::Sender<Claimed>,
    shutdown: CancellationToken,
    slots: Arc<Semaphore>,
    acker: Acker,
    finished: Arc<tokio::sync::Notify>,
    dispatch: Arc<DispatchState>,
) {
    const MAX_IN_FLIGHT: usize = 2;
    let (waiting, marked) = (&dispatch.waiting, &dispatch.marked);
    let opts = &worker.options;
    let concurrency = opts.concurrency.max(1);
    let waker = worker.transport.waker(&worker.queue);
    let mut pause = opts.poll_min;
    // Claims in flight, each with how many messages it asked for.
    let mut claims: JoinSet<(usize, bool, ClaimOutcome)> = JoinSet::new();
    // How many each claim in flight asked for, and whether it starts what it claims, so
    // that a claim task that panicked still gives its share of the buffer back.
    let mut asked_by: HashMap<tokio::task::Id, (usize, bool)> = HashMap::new();
    let mut asked = 0_usize;
    let mut backlog = false;
    let mut notified = None;
    loop {
        if shutdown.is_cancelled() || tx.is_closed() {
            break;
        }
        // How many to claim: while handlers are fast, a whole batch into the buffer;
        // while they are slow, only what free handlers can start now. Claims in flight
        // count as buffered.
        let fast = worker.counters.handlers_are_fast();
        // A single handler gets its messages strictly in order: no overlapping claims.
        let limit = if backlog && fast && concurrency > 1 {
            MAX_IN_FLIGHT
        } else {
            1
        };
        if claims.len() < limit {
            // While handlers are slow, messages marked and waiting in the dispatcher count
            // too, so that a slow worker claims no more than its free slots.
            let waiting_marked = if fast {
                0
            } else {
                marked.load(Ordering::SeqCst)
            };
            let buffered = tx.max_capacity() - tx.capacity()
                + waiting_marked
                + dispatch.stashed.load(Ordering::SeqCst)
                + asked;
            let ahead = if fast { opts.prefetch } else { 0 };
            let free = slots.available_permits() + usize::from(waiting.load(Ordering::SeqCst));
            let room = (free + ahead)
                .saturating_sub(buffered)
                .min(tx.capacity().saturating_sub(asked));
            // While handlers are fast, wait for half a batch of room so that one commit
            // claims several messages; slow handlers get theirs at once.
            let least = if fast { (concurrency / 2).max(1) } else { 1 };
            if room >= least {
                if claims.is_empty() {
                    // Register for the wake-up before reserving, so a publish in between
                    // is seen.
                    let mut n = waker.as_ref().map(|n| Box::pin(n.clone().notified_owned()));
                    if let Some(n) = n.as_mut() {
                        n.as_mut().enable();
                    }
                    notified = n;
                }
                let (transport, queue) = (worker.transport.clone(), worker.queue.clone());
                // Counted before `quiet` is read, so that a dispatcher that set `quiet`
                // and then saw no starting claim can be sure none begins after.
                let starts = fast && {
                    dispatch.starting.fetch_add(1, Ordering::SeqCst);
                    let quiet = dispatch.quiet.load(Ordering::SeqCst);
                    if quiet {
                        dispatch.starting.fetch_sub(1, Ordering::SeqCst);
                    }
                    !quiet
                };
                let handle = claims.spawn(async move {
                    // While handlers keep up, messages start as they are claimed (one
                    // round trip fewer per batch); a crash then charges them an attempt
                    // each, at most once, because a message with attempts is never
                    // started by its claim.
                    let claimed = if starts {
                        transport.prefetch_batch_starting_fresh(&queue, room).await
                    } else {
                        transport
                            .prefetch_batch(&queue, room)
                            .await
                            .map(|batch| batch.into_iter().map(|r| (r, false)).collect())
                    };
                    (room, starts, claimed)
                });
                asked_by.insert(handle.id(), (room, starts));
                asked += room;
                continue;
            }
        }
        let joined = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            joined = claims.join_next_with_id(), if !claims.is_empty() => joined,
            // Room for a claim: a job finished, or the buffer drained as jobs started.
            _ = finished.notified(), if claims.len() < limit => continue,
            _ = tokio::time::sleep(opts.poll_min.max(Duration::from_millis(1))), if claims.len() < limit => continue,
        };
        let (n, starts, claimed) = match joined {
            Some(Ok((id, done))) => {
                asked_by.remove(&id);
                done
            }
            // What a panicked claim took stays leased until its lease runs out.
            Some(Err(err)) => {
                tracing::error!(error = %err, "a claim task failed");
                let (n, starts) = asked_by.remove(&err.id()).unwrap_or((0, false));
                asked = asked.saturating_sub(n);
                if starts {
                    dispatch.starting.fetch_sub(1, Ordering::SeqCst);
                }
                continue;
            }
            None => continue,
        };
        // Whatever this claim started is in the channel once this is released.
        let _started_sent = StartingClaim {
            dispatch: &dispatch,
            starts,
        };
        asked = asked.saturating_sub(n);
        match claimed {
            Ok(batch) if !batch.is_empty() => {
                pause = opts.poll_min;
                for (r, _) in &batch {
                    let env = &r.envelope;
                    crate::metrics::count(crate::metrics::RESERVED, &env.queue, &env.kind, 1);
                }
                backlog = batch.len() >= n;
                let at = std::time::Instant::now();
                for (reservation, started) in batch {
                    if let Err(mpsc::error::SendError((r, _))) =
                        tx.send((reservation, started.then_some(at))).await
                    {
                        // The dispatcher stopped: the worker is shutting down.
                        give_back(&worker, &r).await;
                    }
                }
            }
            Ok(_) => {
                backlog = false;
                if !claims.is_empty() {
                    continue;
                }
                let free = slots.available_permits() + usize::from(waiting.load(Ordering::SeqCst));
                let idle = free == concurrency
                    && tx.capacity() == tx.max_capacity()
                    && dispatch.stashed.load(Ordering::SeqCst) == 0
                    && acker.is_idle();
                if opts.drain && idle && worker.queue_is_empty().await {
                    break;
                }
                let wake = notified.take();
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                    _ = async { if let Some(n) = wake { n.await } else { std::future::pending().await } } => {}
                }
                pause = (pause * 2).min(opts.poll_max);
            }
            Err(err) => {
                backlog = false;
                tracing::warn!(queue = %worker.queue, error = %err, retry_in = ?pause, "reserve failed");
                if claims.is_empty() {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                pause = (pause * 2).min(opts.poll_max.max(Duration::from_secs(5)));
            }
        }
    }
    // What claims still in flight bring back goes back at once, uncharged.
    while let Some(joined) = claims.join_next().await {
        if let Ok((_, starts, outcome)) = joined {
            if starts {
                dispatch.starting.fetch_sub(1, Ordering::SeqCst);
            }
            let Ok(batch) = outcome else { continue };
            for (r, _) in batch {
                give_back(&worker, &r).await;
            }
        }
    }
}

/// Gives back a message that was claimed but never started.
async fn give_back(worker: &Worker, r: &Reservation) {
    if let Err(err) = worker.transport.abandon(r).await {
        worker.log_settle_error("give back", &err);
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".into())
}
