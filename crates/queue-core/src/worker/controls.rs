//! The worker's side of an operator's controls ([`crate::Controls`]): it claims nothing
//! from a paused queue, puts back jobs of a paused kind, never runs a job marked
//! cancelled, and cancels the handler of a running one; a cancelled job ends
//! `cancelled`, its message acked. What is paused and cancelled is read from the store
//! at most every [`REFRESH`], so every worker sees a change within a poll.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use uuid::Uuid;

use super::builder::Worker;
use crate::controls::{Controls, Paused};
use crate::reservation::Reservation;
use crate::status::{JobState, StatusUpdate};
use crate::transport_ext::TransportExt;

/// How old the worker's view of the controls may be.
pub(super) const REFRESH: Duration = Duration::from_millis(250);

/// How long a job of a paused kind waits before it is tried again.
const PAUSED_KIND_WAIT: Duration = Duration::from_secs(1);

/// What the worker last read of the controls.
#[derive(Debug, Default)]
struct Seen {
    at: Option<Instant>,
    paused: Vec<Paused>,
    cancelled: HashSet<Uuid>,
}

/// The controls store and the worker's view of it.
#[derive(Debug)]
pub(super) struct ControlView {
    store: Arc<dyn Controls>,
    seen: Mutex<Seen>,
}

impl ControlView {
    pub(super) fn new(store: Arc<dyn Controls>) -> Self {
        ControlView {
            store,
            seen: Mutex::default(),
        }
    }

    /// Reads `f` of the view, refreshing it first when it is older than [`REFRESH`]. A
    /// failed read keeps the last view (a store that is down pauses nothing new).
    async fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        let mut seen = self.seen.lock().await;
        if seen.at.is_none_or(|at| at.elapsed() >= REFRESH) {
            match (self.store.paused().await, self.store.cancelled().await) {
                (Ok(paused), Ok(cancelled)) => {
                    seen.paused = paused;
                    seen.cancelled = cancelled.into_iter().collect();
                }
                (Err(err), _) | (_, Err(err)) => {
                    tracing::warn!(error = %err, "reading paused queues and cancellations failed; keeping the last view");
                }
            }
            seen.at = Some(Instant::now());
        }
        f(&seen)
    }
}

impl Worker {
    /// Whether the whole queue is paused: nothing is claimed.
    pub(super) async fn queue_paused(&self) -> bool {
        let Some(view) = &self.controls else {
            return false;
        };
        let queue = self.queue.as_str();
        view.with(|s| {
            s.paused
                .iter()
                .any(|p| p.queue == queue && p.kind.is_none())
        })
        .await
    }

    /// Whether `r` must not run: cancelled (ended `cancelled`) or of a paused kind (put
    /// back to wait, no attempt counted). `true` when it was settled so.
    pub(super) async fn held_by_controls(&self, r: &Reservation) -> bool {
        let Some(view) = &self.controls else {
            return false;
        };
        let env = &r.envelope;
        let (cancelled, paused) = view
            .with(|s| {
                (
                    s.cancelled.contains(&env.id),
                    s.paused.iter().any(|p| {
                        p.queue == env.queue.as_str()
                            && p.kind.as_deref() == Some(env.kind.as_str())
                    }),
                )
            })
            .await;
        if cancelled {
            self.end_cancelled(r, false).await;
            return true;
        }
        if paused {
            match self.transport.snooze(r, PAUSED_KIND_WAIT).await {
                Ok(()) => tracing::debug!("its kind is paused; back in a second"),
                Err(err) => self.log_settle_error("paused kind wait", &err),
            }
            return true;
        }
        false
    }

    /// Whether the running job `id` has been cancelled.
    pub(super) async fn is_cancelled(&self, id: Uuid) -> bool {
        match &self.controls {
            Some(view) => view.with(|s| s.cancelled.contains(&id)).await,
            None => false,
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
                    if let Err(err) = view.store.forget(&[env.id]).await {
                        tracing::warn!(error = %err, "forgetting a cancellation failed; it is forgotten by a later prune");
                    }
                }
            }
            Err(err) => self.log_settle_error("cancel", &err),
        }
    }
}
