//! One message's run: settled on arrival when it must not run, else its handler run
//! with heartbeats, a timeout and cancellation, and the outcome acked, released or
//! dead-lettered.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::acker::{Acker, Left};
use super::builder::Worker;
use super::freshness::Freshness;
use super::handler::Report;
use super::handler::{JobContext, JobError, JobResult};
use super::limits::{HeldLease, Taken};
use super::options::UnknownKind;
use crate::checkpoint::JobCheckpoint;
use crate::error::Error;
use crate::job_log::JobLog;
use crate::reason;
use crate::reservation::Reservation;
use crate::status::{JobState, StatusUpdate};
use crate::transport_ext::TransportExt;

/// How long a cancelled handler may take to notice its token before it is aborted.
const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// What ended one handler run.
enum Ending {
    Finished(JobResult),
    Panicked(String),
    TimedOut(Duration),
    LeaseLost,
    /// An operator cancelled the job.
    Cancelled,
    /// Its limit slots ran out or another lease took them: it goes back, uncharged.
    SlotLost,
    ShutDown,
}

impl Worker {
    pub(super) async fn run_one(
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
        crate::trace_context::adopt(&span, &env.headers, env.attempts == 0);
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
    pub(super) async fn settle_on_arrival(&self, r: &Reservation) -> bool {
        self.forget_stale_mark(r).await;
        let env = &r.envelope;
        let max_attempts = self.options.retry.max_attempts_for(env);
        if !self.transport.capabilities().expiry && env.is_expired_at(chrono::Utc::now()) {
            self.dead_letter(
                r,
                env.attempts,
                reason::EXPIRED,
                "expired before it could be handled",
                None,
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
            self.dead_letter(r, env.attempts, reason::MAX_ATTEMPTS, &why, None)
                .await;
            return true;
        }
        if !self.handlers.contains_key(&env.kind) && self.fallback.is_none() {
            let why = format!("no handler for kind {:?} on this worker", env.kind);
            match self.options.unknown_kind {
                UnknownKind::DeadLetter => {
                    self.dead_letter(r, env.attempts, reason::NO_HANDLER, &why, None)
                        .await
                }
                UnknownKind::Release(delay) => {
                    self.release(r, env.attempts, JobState::Pending, delay, &why, None)
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
        if self.held_by_controls(&r).await {
            return;
        }
        // The lease was taken no later than now (a prefetched one earlier: the run's
        // view of it errs late, and the heartbeat's answer settles it).
        let began = std::time::Instant::now();
        let mut held = match self.take_limits(&r).await {
            Taken::Free => None,
            Taken::Held(held) => Some(held),
            Taken::HeldBack => return,
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
        let checkpoint = self.job_checkpoint(&r);
        let log = self.job_log(&r);
        let freshness = Freshness::new(began, r.lease, held.as_ref().map(|h| (h.renewed, h.hold)));
        let ctx = JobContext {
            envelope: env.clone(),
            attempt,
            max_attempts,
            lease_token: r.token(),
            cancel: cancel.clone(),
            shutdown,
            report,
            tenant: self.tenant.clone(),
            freshness: freshness.clone(),
            checkpoint: checkpoint.clone(),
            log: log.clone(),
        };
        if self.slots_lapsed(&r, held.as_ref()).await {
            return;
        }
        let started = std::time::Instant::now();
        // Its own task, so that a panic is caught as a JoinError; aborted if this run is
        // dropped, since nothing would renew its lease or settle it any more.
        let job = AbortOnDropHandle::new(tokio::spawn(
            async move { handler.handle(ctx).await }.instrument(tracing::Span::current()),
        ));
        let ending = self
            .watch(&r, held.as_mut(), &freshness, job, &cancel, &hard_stop)
            .await;
        let elapsed = started.elapsed();
        if let Some(log) = &log {
            flush_log(log, r.lease).await;
        }
        self.counters.record_duration(elapsed);
        crate::metrics::handler_duration(self.tenant.as_deref(), &env.queue, &env.kind, elapsed);
        let left = match ending {
            Ending::Finished(Ok(())) => Left {
                result: result.lock().ok().and_then(|mut slot| slot.take()),
                checkpoint: checkpoint.filter(JobCheckpoint::touched),
            },
            _ => Left::default(),
        };
        self.settle(r, ending, left, max_attempts, elapsed, acker)
            .await;
        // The run is over whatever its settlement came to: a stale lease's free names a
        // token its slots no longer carry, and frees nothing.
        if let Some(held) = held {
            self.free_limits(&held).await;
        }
    }

    /// Whether the run's limit slots ran out before its handler started: a worker
    /// stopped (frozen, swapped out) between taking them and starting may wake after
    /// another job took them, and must not start then. Such a run goes back unstarted.
    async fn slots_lapsed(&self, r: &Reservation, held: Option<&HeldLease>) -> bool {
        let Some(held) = held.filter(|h| !h.still_held()) else {
            return false;
        };
        tracing::warn!("the job's limit slots ran out before it started; it goes back");
        self.snoozed(
            r,
            Duration::ZERO,
            "its limit slots ran out before it started",
            false,
        )
        .await;
        self.free_limits(held).await;
        true
    }

    /// Waits for the handler's end while renewing its lease (and limit slots) every third
    /// of it; on a timeout, a lost lease or slot, an operator's cancel or shutdown,
    /// cancels it (aborting it after a grace).
    async fn watch(
        &self,
        r: &Reservation,
        mut held: Option<&mut HeldLease>,
        freshness: &Freshness,
        mut job: AbortOnDropHandle<JobResult>,
        cancel: &CancellationToken,
        hard_stop: &CancellationToken,
    ) -> Ending {
        let lease = r.lease;
        let every = (lease / 3).max(Duration::from_millis(10));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        // Slots are renewed on a beat of their own: where a delivery has no lease that
        // runs out (RabbitMQ), they are held for less than the nominal lease.
        let slot_every = held
            .as_deref()
            .map_or(Duration::from_secs(3600), HeldLease::renew_every);
        let mut slot_beat =
            tokio::time::interval_at(tokio::time::Instant::now() + slot_every, slot_every);
        // Cancellations are read from the worker's view of the controls, which one read
        // every quarter second keeps current for all its jobs.
        let look = super::control_view::REFRESH;
        let mut cancel_check = tokio::time::interval_at(tokio::time::Instant::now() + look, look);
        let id = r.envelope.id;
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
                _ = cancel_check.tick(), if self.controls.is_some() => {
                    if self.is_cancelled(id).await {
                        tracing::info!("cancelled by an operator; cancelling the handler");
                        break Ending::Cancelled;
                    }
                }
                // The heartbeat: only jobs that outlive a third of the lease pay for it.
                _ = slot_beat.tick(), if held.is_some() => {
                    if let Some(held) = held.as_deref_mut() {
                        if !self.renew_limits(held).await {
                            tracing::warn!("heartbeat found the job's limit slots lost; cancelling the handler");
                            break Ending::SlotLost;
                        }
                        freshness.slots_renewed(held.renewed);
                    }
                }
                _ = beat.tick() => match self.extend_lease(r, freshness).await {
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
            // A cancelled job gets the grace period of a shutdown to stop (an exec
            // command: SIGTERM, then SIGKILL when it ends).
            // Capped at half the lease, which is no longer renewed: the job must be
            // stopped before another worker could take it.
            let grace = match ending {
                Ending::Cancelled => self.options.grace_period.min(lease / 2),
                _ => CANCEL_GRACE,
            };
            let late = tokio::time::timeout(grace, &mut job).await;
            job.abort();
            // A job that completes cleanly once told to stop at shutdown is done.
            if let (Ending::ShutDown, Ok(Ok(Ok(())))) = (&ending, &late) {
                ending = Ending::Finished(Ok(()));
            }
        }
        // A job that failed because the grace period ran out was stopped by us: it goes
        // back for immediate redelivery, not through the retry backoff.
        // (A job that asked to wait keeps its wait: it counts no attempt either way.)
        let failed = match &ending {
            Ending::Finished(Err(e)) => !matches!(e, JobError::Snooze { .. }),
            Ending::Panicked(_) => true,
            _ => false,
        };
        if hard_stop.is_cancelled() && failed {
            ending = Ending::ShutDown;
        }
        ending
    }

    /// Extends the lease for its length, and tells the handler's view when it holds.
    async fn extend_lease(&self, r: &Reservation, freshness: &Freshness) -> crate::Result<()> {
        let asked = std::time::Instant::now();
        self.transport.extend(r, r.lease).await?;
        freshness.lease_renewed(asked);
        Ok(())
    }

    /// Acks, releases or dead-letters the message by how its run ended.
    async fn settle(
        &self,
        r: Reservation,
        ending: Ending,
        left: Left,
        max_attempts: u32,
        elapsed: Duration,
        acker: Acker,
    ) {
        let attempt = r.envelope.attempts + 1;
        match ending {
            Ending::Finished(Ok(())) => {
                tracing::debug!(?elapsed, "handled");
                acker.ack(r, left, elapsed).await;
            }
            Ending::Finished(Err(JobError::Fail { message })) => {
                tracing::warn!(error = %message, "handler failed for good");
                self.dead_letter(&r, attempt, reason::FAILED, &message, Some(elapsed))
                    .await;
            }
            Ending::Finished(Err(JobError::Retry { message, after })) => {
                self.failed(&r, max_attempts, &message, after, elapsed)
                    .await;
            }
            Ending::Finished(Err(JobError::Snooze {
                message,
                after,
                rate_limited,
            })) => self.snoozed(&r, after, &message, rate_limited).await,
            Ending::Panicked(message) => {
                let message = format!("handler panicked: {message}");
                self.failed(&r, max_attempts, &message, None, elapsed).await;
            }
            Ending::TimedOut(limit) => {
                let message = format!("handler timed out after {limit:?}");
                self.failed(&r, max_attempts, &message, None, elapsed).await;
            }
            Ending::LeaseLost => {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "lease lost while handling: another worker has the message; stopped"
                );
            }
            Ending::Cancelled => self.end_cancelled(&r, true).await,
            Ending::SlotLost => {
                self.snoozed(&r, Duration::ZERO, "its limit slots were lost", false)
                    .await
            }
            Ending::ShutDown => self.release_at_shutdown(&r, attempt).await,
        }
    }

    /// Gives back a job stopped by shutdown for immediate redelivery.
    async fn release_at_shutdown(&self, r: &Reservation, attempt: u32) {
        let release = self.transport.release(
            r,
            Duration::ZERO,
            Some("the worker shut down before the job finished"),
        );
        match release.await {
            Ok(()) => {
                self.counters
                    .released_on_shutdown
                    .fetch_add(1, Ordering::Relaxed);
                self.record(|| StatusUpdate::ended(&r.envelope, attempt, JobState::Pending, None));
            }
            Err(err) => self.log_settle_error("release at shutdown", &err),
        }
    }

    /// A job that has to wait: back after `after` (at least [`MIN_SNOOZE`], at most
    /// [`MAX_SNOOZE`]), its attempt not counted (so neither the backoff nor the attempt
    /// limit moves).
    async fn snoozed(&self, r: &Reservation, after: Duration, message: &str, rate_limited: bool) {
        let after = after.clamp(MIN_SNOOZE, MAX_SNOOZE);
        match self.transport.snooze(r, after).await {
            Ok(()) => {
                tracing::debug!(retry_in = ?after, rate_limited, reason = message, "snoozed");
                let env = &r.envelope;
                crate::metrics::snoozed(
                    self.tenant.as_deref(),
                    &env.queue,
                    &env.kind,
                    rate_limited,
                );
                // The attempt that ran is closed as pending, as an unrun give-back is,
                // keeping the last failure as it was. A transport that keeps start marks
                // in the status store closed it already, before the message went back:
                // written again here, after, it could land on the next run's start.
                if !self.transport.capabilities().start_marks_in_status {
                    self.record(|| {
                        StatusUpdate::ended(env, env.attempts + 1, JobState::Pending, None)
                    });
                }
            }
            Err(err) => self.log_settle_error("snooze", &err),
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
        ran_for: Duration,
    ) {
        let failures = r.envelope.attempts + 1;
        if failures >= max_attempts {
            tracing::info!(error = %message, failures, "attempts exhausted");
            self.dead_letter(r, failures, reason::MAX_ATTEMPTS, message, Some(ran_for))
                .await;
        } else {
            let delay = after.unwrap_or_else(|| self.options.retry.backoff(failures));
            tracing::info!(error = %message, retry_in = ?delay, "handler failed; will retry");
            self.release(
                r,
                failures,
                JobState::Retrying,
                delay,
                message,
                Some(ran_for),
            )
            .await;
        }
    }

    /// Releases `r` after `delay`; its status becomes `state` (`retrying` after a
    /// failure, `pending` when it was never run).
    pub(super) async fn release(
        &self,
        r: &Reservation,
        attempt: u32,
        state: JobState,
        delay: Duration,
        message: &str,
        ran_for: Option<Duration>,
    ) {
        match self.transport.release(r, delay, Some(message)).await {
            Ok(()) => {
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
                let env = &r.envelope;
                crate::metrics::count(
                    crate::metrics::RELEASED,
                    self.tenant.as_deref(),
                    &env.queue,
                    &env.kind,
                    1,
                );
                self.record(|| ended(env, attempt, state, message, ran_for));
            }
            Err(err) => self.log_settle_error("release", &err),
        }
    }

    pub(super) async fn dead_letter(
        &self,
        r: &Reservation,
        attempt: u32,
        why: &str,
        message: &str,
        ran_for: Option<Duration>,
    ) {
        match self.transport.dead_letter(r, why, Some(message)).await {
            Ok(()) => {
                self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reason = why, error = %message, "dead-lettered");
                let env = &r.envelope;
                crate::metrics::dead_lettered(self.tenant.as_deref(), &env.queue, &env.kind, why);
                let state = if why == reason::FAILED {
                    JobState::Failed
                } else {
                    JobState::Dead
                };
                self.record(|| ended(env, attempt, state, message, ran_for));
            }
            Err(err) => self.log_settle_error("dead-letter", &err),
        }
    }

    pub(super) fn log_settle_error(&self, what: &str, err: &Error) {
        if err.is_lease_lost() {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{what} refused: the lease was lost, another worker has the message");
        } else {
            tracing::error!(error = %err, "{what} failed; the message will be delivered again when its lease runs out");
        }
    }
}

/// The shortest snooze: the attempt's `pending` record, written in the background, then
/// lands before the next run's start.
const MIN_SNOOZE: Duration = Duration::from_secs(1);

/// The longest snooze (100 years): a store adds it to its clock.
const MAX_SNOOZE: Duration = Duration::from_secs(100 * 366 * 24 * 60 * 60);

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".into())
}

/// An attempt's ending, dated by its handler's run time when it ran.
fn ended(
    env: &crate::envelope::Envelope,
    attempt: u32,
    state: JobState,
    message: &str,
    ran_for: Option<Duration>,
) -> StatusUpdate {
    let update = StatusUpdate::ended(env, attempt, state, Some(message));
    match ran_for {
        Some(d) => update.after(d),
        None => update,
    }
}

/// Stores a run's last log lines, waiting at most a quarter of its lease (at most 1 s):
/// the lease is no longer renewed, and a slow store must not hold the ack back.
async fn flush_log(log: &JobLog, lease: Duration) {
    let within = (lease / 4).min(Duration::from_secs(1));
    if tokio::time::timeout(within, log.flush()).await.is_err() {
        tracing::warn!("the job's last log lines were not stored in time");
    }
}
