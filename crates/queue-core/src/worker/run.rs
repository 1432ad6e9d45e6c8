//! A worker's run from start to stop: the services it starts (registration, status
//! writer, acker, fetcher, upkeep), the dispatcher, and the order in which they wind
//! down.

use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::acker::Acker;
use super::builder::Worker;
use super::counters::WorkerReport;
use super::dispatch::Dispatcher;
use super::fetch::{Claimed, DispatchState, Fetcher, Links};
use super::registration::Registration;
use crate::error::{ConfigError, Error, Result};
use crate::status::{StatusFlusher, StatusWriter};

impl Worker {
    /// Runs until `shutdown` is cancelled (or, with `drain`, until the queue is empty),
    /// then stops reserving, lets in-flight handlers finish within the grace period,
    /// releases what is still unfinished so that it is delivered again at once, and
    /// flushes pending acks.
    ///
    /// Backend errors while reserving are logged and retried with backoff; they never
    /// stop the worker. Dropping the future stops everything the run started, its
    /// handlers included, without the grace period: what it held comes back as after a
    /// crash (see the worker's shutdown in `docs/jobs.md`).
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
        self.check_status_store()?;
        let mut this = self;
        this.claim_as()?;
        this.check_limits()?;
        // What the run starts stops with `scope`, cancelled by `shutdown` and by a drop
        // of the run's future: a caller that drops it (a timeout around it, a `select!`
        // that took another branch) must not leave its schedules firing. The heartbeat
        // beats on through the grace period, so it stops only at the end or on a drop.
        let scope = shutdown.child_token();
        let _stop_when_dropped = scope.clone().drop_guard();
        let dropped = CancellationToken::new();
        let _beat_until_dropped = dropped.clone().drop_guard();
        let scheduling = this.start_schedules(scope.child_token()).await?;
        this.controls = this
            .status
            .as_ref()
            .and_then(|s| s.controls())
            .map(|store| Arc::new(super::control_view::ControlView::new(store)));
        // Read once before the first claim: a queue paused before the worker started is
        // never claimed.
        let refreshing = match &this.controls {
            Some(view) => {
                view.refresh().await;
                Some(view.spawn_refresh(scope.child_token()))
            }
            None => None,
        };
        let worker = Arc::new(this);
        let concurrency = worker.options.concurrency.max(1);
        let services = Services::start(&worker, concurrency, &dropped);
        let waking = worker.spawn_wake_parked(scope.child_token());
        // Its own token, cancelled as the worker winds down: a draining worker stops
        // without `shutdown`.
        let upkeep_stop = scope.child_token();
        let upkeep = worker.spawn_upkeep(upkeep_stop.clone());
        // Claims come in batches of at least `concurrency` into a buffer of twice that,
        // so a handler that finishes finds its next message waiting and one commit
        // claims many messages.
        let (tx, rx) = mpsc::channel::<Claimed>(concurrency + worker.options.prefetch);
        let links = Links {
            worker: worker.clone(),
            shutdown: scope,
            slots: Arc::new(Semaphore::new(concurrency)),
            acker: services.acker.clone(),
            finished: Arc::new(tokio::sync::Notify::new()),
            dispatch: Arc::new(DispatchState::default()),
        };
        let fetcher = tokio::spawn(
            Fetcher {
                links: links.clone(),
                tx,
            }
            .run(),
        );
        let mut dispatcher = Dispatcher::new(links, rx, fetcher);
        tracing::info!(queue = %worker.queue, transport = worker.transport.name(), concurrency, "worker started");
        dispatcher.run().await;
        upkeep_stop.cancel();
        dispatcher.finish(abort).await;
        for task in [refreshing, waking, scheduling].into_iter().flatten() {
            task.abort();
        }
        if let Some(upkeep) = upkeep {
            super::upkeep::finish(upkeep).await;
        }
        services.finish().await;
        let report = worker.counters.snapshot();
        tracing::info!(queue = %worker.queue, ?report, "worker stopped");
        Ok(report)
    }

    /// Checks the worker's name and labels, and sets what its claims record and select.
    fn claim_as(&mut self) -> Result<()> {
        if let Some(name) = &self.options.name {
            if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
                return Err(Error::Config(ConfigError::new(
                    "worker name",
                    Some(name.clone()),
                    "1 to 64 printable characters",
                )));
            }
            self.holder = Arc::from(format!("{}/{name}", crate::registry::process_holder()));
        }
        let labels = crate::labels::normalize(self.options.labels.clone())?;
        if !labels.is_empty() && !self.transport.capabilities().label_claims {
            return Err(Error::NotSupported(format!(
                "the {} transport cannot claim by label: a queue there hands out messages in its own order, so a consumer cannot pass over the ones it does not want; give that work a queue of its own",
                self.transport.name()
            )));
        }
        self.labels = Arc::from(labels);
        Ok(())
    }

    /// Where the transport keeps its start marks in its status store, the jobs' ends
    /// must be recorded there too, or their marks would read as crashes.
    fn check_status_store(&self) -> Result<()> {
        if self.status.is_some() || !self.transport.capabilities().start_marks_in_status {
            return Ok(());
        }
        Err(Error::Config(ConfigError::new(
            "QUEUE_STATUS",
            None,
            format!(
                "the {} transport keeps start marks in a status store: give the worker that store (Worker::with_status, or Worker::for_jobs with switchyard::connect_jobs)",
                self.transport.name()
            ),
        )))
    }
}

/// The background services of one run, stopped in order once the dispatcher is done.
struct Services {
    acker: Acker,
    ack_flusher: tokio::task::JoinHandle<()>,
    status_flusher: Option<StatusFlusher>,
    registration: Option<Registration>,
}

impl Services {
    fn start(worker: &Arc<Worker>, concurrency: usize, dropped: &CancellationToken) -> Self {
        let status = worker.status.clone();
        let label = crate::status::worker_label();
        let registration = status.clone().map(|store| {
            Registration::start(
                store,
                worker.queue.as_str(),
                concurrency,
                worker.counters.clone(),
                dropped.child_token(),
            )
        });
        let status_flusher = status.map(|store| {
            let (writer, flusher) = StatusWriter::spawn(store);
            let _ = worker.writer.set(writer.for_worker(&label));
            flusher
        });
        let (acker, ack_flusher) = Acker::spawn(
            worker.transport.clone(),
            worker.options.ack_batch,
            worker.counters.clone(),
            worker.writer.get().cloned(),
            worker.tenant.clone(),
        );
        Services {
            acker,
            ack_flusher,
            status_flusher,
            registration,
        }
    }

    /// Commits the last acks (every other holder of the acker has ended), then the
    /// last status updates, then deregisters.
    async fn finish(self) {
        drop(self.acker);
        if self.ack_flusher.await.is_err() {
            tracing::error!(
                "the ack flusher panicked; unacknowledged messages will be delivered again"
            );
        }
        if let Some(flusher) = self.status_flusher {
            flusher.finish().await;
        }
        if let Some(registration) = self.registration {
            registration.finish().await;
        }
    }
}
