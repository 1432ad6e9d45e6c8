//! The worker and how it is put together: its transport, queue, handlers, options and
//! optional status store.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use super::counters::WorkerCounters;
use super::handler::Handler;
use super::options::WorkerOptions;
use crate::names::QueueName;
use crate::status::{Jobs, StatusStore, StatusUpdate, StatusWriter};
use crate::transport::Transport;

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
    pub(super) transport: Arc<dyn Transport>,
    pub(super) queue: QueueName,
    pub(super) handlers: HashMap<String, Arc<dyn Handler>>,
    pub(super) fallback: Option<Arc<dyn Handler>>,
    pub(super) options: WorkerOptions,
    pub(super) counters: Arc<WorkerCounters>,
    pub(super) status: Option<Arc<dyn StatusStore>>,
    /// Set when the worker starts, if it records status.
    pub(super) writer: OnceLock<StatusWriter>,
    /// Recorded as the holder of each claim (`host:pid`, `/name` when named).
    pub(super) holder: Arc<str>,
    /// The claims' label filter, checked.
    pub(super) labels: Arc<[String]>,
    /// `options.tenant`, shared with each job's context.
    pub(super) tenant: Option<Arc<str>>,
    /// Where those are kept: set when the worker starts, if it has limits.
    pub(super) limit_store: Option<Arc<dyn crate::limit_store::LimitStore>>,
    /// Takes turns at the limit store between this worker's jobs of one key.
    pub(super) limit_turns: super::limit_turns::Turns,
    /// Paused queues and cancellations, when its status store keeps them: set when the
    /// worker starts.
    pub(super) controls: Option<Arc<super::control_view::ControlView>>,
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
        let options_tenant = options.tenant.as_deref().map(Arc::from);
        Worker {
            transport,
            queue,
            handlers: HashMap::new(),
            fallback: None,
            options,
            counters: Arc::default(),
            status: None,
            writer: OnceLock::new(),
            holder: Arc::from(crate::registry::process_holder()),
            labels: Arc::from(Vec::new()),
            tenant: options_tenant,
            limit_store: None,
            limit_turns: super::limit_turns::Turns::default(),
            controls: None,
        }
    }

    /// A worker for `queue` over the transport of `jobs` that records job status in
    /// its store when it has one: the jobs it runs show on the dashboard and answer
    /// `publish --wait` and [`Jobs::publish_and_wait`] with no further step.
    /// The worker serves the tenant of `jobs` unless `options` name one.
    pub fn for_jobs(jobs: &Jobs, queue: QueueName, mut options: WorkerOptions) -> Self {
        if options.tenant.is_none() {
            options.tenant = jobs.tenant().map(str::to_owned);
        }
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

    pub(super) fn record(&self, update: impl FnOnce() -> StatusUpdate) {
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

    /// Whether the queue holds nothing at all: ready, delayed or leased.
    pub(super) async fn queue_is_empty(&self) -> bool {
        // Stats count every label: a worker that selects labels ends at its first empty
        // claim with nothing in flight, and leaves the rest to other workers.
        if !self.labels.is_empty() {
            return true;
        }
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
