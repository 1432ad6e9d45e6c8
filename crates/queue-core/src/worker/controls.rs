//! The worker's side of an operator's controls ([`crate::Controls`]): it claims nothing
//! from a paused queue, puts back jobs of a paused queue or kind that it had claimed,
//! never runs a job marked cancelled, and cancels the handler of a running one; a
//! cancelled job ends `cancelled`, its message acked. It reads them from its view
//! (`control_view.rs`), which every worker keeps current within a poll.

use std::time::Duration;

use uuid::Uuid;

use super::builder::Worker;
use crate::reservation::Reservation;
use crate::status::{JobState, StatusUpdate};
use crate::transport_ext::TransportExt;

/// How long a claimed job of a paused queue or kind waits before it is tried again.
const PAUSED_WAIT: Duration = Duration::from_secs(1);

impl Worker {
    /// Whether the whole queue is paused: nothing is claimed.
    pub(super) fn queue_paused(&self) -> bool {
        self.controls
            .as_ref()
            .is_some_and(|view| view.queue_paused(self.queue.as_str()))
    }

    /// Whether `r` must not run: cancelled (ended `cancelled`), or of a paused queue or
    /// kind (put back to wait, no attempt counted). `true` when it was settled so.
    pub(super) async fn held_by_controls(&self, r: &Reservation) -> bool {
        let Some(view) = &self.controls else {
            return false;
        };
        let env = &r.envelope;
        // A store that cannot tell leaves the mark as last read standing.
        let cancelled = self.marked(env.id, true).await;
        let paused = view.start_paused(env.queue.as_str(), &env.kind);
        if cancelled {
            self.end_cancelled(r, false).await;
            return true;
        }
        if paused {
            match self.transport.snooze(r, PAUSED_WAIT).await {
                Ok(()) => tracing::debug!("its queue or kind is paused; back in a second"),
                Err(err) => self.log_settle_error("paused wait", &err),
            }
            return true;
        }
        false
    }

    /// Forgets the cancellation mark of `r`'s job where its status says the job
    /// completed or died (a bulk replay, or a publish under its id, runs it again): a
    /// mark made as that run ended, which its worker never saw. Called as the message
    /// arrives, before its start is recorded (RabbitMQ's control store records it in the
    /// job's status, which would then say `running`). A mark that cannot be forgotten,
    /// or a status that cannot be read, leaves the job cancelled.
    pub(super) async fn forget_stale_mark(&self, r: &Reservation) {
        let (Some(view), Some(store)) = (&self.controls, &self.status) else {
            return;
        };
        let id = r.envelope.id;
        if !view.is_cancelled(id) {
            return;
        }
        match store.get(id).await {
            // Not `cancelled`: a redelivered copy of a job ended cancelled (its ack lost)
            // stays cancelled.
            Ok(Some(status))
                if matches!(
                    status.state,
                    JobState::Completed | JobState::Failed | JobState::Dead
                ) =>
            {
                match view.store().forget(&[id]).await {
                    Ok(()) => {
                        tracing::info!(state = %status.state, "a cancellation mark left from a run that ended, forgotten; this run goes ahead")
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "forgetting a cancellation mark left from a run that ended failed; the job is cancelled")
                    }
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "reading a cancelled job's status failed; it stays cancelled");
            }
        }
    }

    /// Whether the running job `id` has been cancelled. A store that cannot tell lets
    /// it run on; the next check asks again.
    pub(super) async fn is_cancelled(&self, id: Uuid) -> bool {
        self.marked(id, false).await
    }

    /// Whether job `id` is marked: in the view, then confirmed by the store, since the
    /// view may be a poll old and a mark forgotten since (a replay, a stale mark) must
    /// neither keep its job from starting nor cancel it running. `unknown` when the
    /// store cannot tell.
    async fn marked(&self, id: Uuid, unknown: bool) -> bool {
        let Some(view) = self.controls.as_ref().filter(|v| v.is_cancelled(id)) else {
            return false;
        };
        match view.store().is_marked(id).await {
            Ok(marked) => marked,
            Err(err) => {
                tracing::warn!(error = %err, "reading a cancellation mark failed");
                unknown
            }
        }
    }

    /// Ends `r` cancelled: its message acked, its status `cancelled`, its mark forgotten.
    pub(super) async fn end_cancelled(&self, r: &Reservation, ran: bool) {
        let env = &r.envelope;
        match self.transport.ack(r).await {
            Ok(()) => {
                tracing::info!(ran, "cancelled");
                crate::metrics::cancelled(self.tenant.as_deref(), &env.queue, &env.kind, ran);
                self.record(|| {
                    StatusUpdate::ended(
                        env,
                        env.attempts + 1,
                        JobState::Cancelled,
                        Some("cancelled by an operator"),
                    )
                });
                if let Some(view) = &self.controls {
                    if let Err(err) = view.store().forget(&[env.id]).await {
                        tracing::warn!(error = %err, "forgetting a cancellation failed; its mark stays (it cancels nothing more)");
                    }
                }
            }
            Err(err) => self.log_settle_error("cancel", &err),
        }
    }
}
