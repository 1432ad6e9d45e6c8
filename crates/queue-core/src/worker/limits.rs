//! The worker's side of limits ([`crate::limit`]): a job takes its slots and tokens
//! before its handler runs, renews them with its lease's heartbeat, and frees them when
//! its run ends; a job that finds a limit reached goes back without running and without
//! counting an attempt (parked until a slot frees, where the store can park it).

use std::sync::Arc;
use std::time::Duration;

use super::builder::Worker;
use super::limit_turns::acquire_in_turn;
use crate::error::{ConfigError, Error, Result};
use crate::limit::{Acquired, Denial, Limit, Want};
use crate::limit_store::{LimitLease, LimitStore, Parked};
use crate::reservation::Reservation;
use crate::transport_ext::TransportExt;

/// The shortest wait of a job a limit held back (a store adds it to its clock).
const MIN_WAIT: Duration = Duration::from_millis(10);

/// How long a job waits when the limit store could not be asked.
const STORE_DOWN_WAIT: Duration = Duration::from_secs(1);

/// How long a parked job waits at most when no release wakes it (its waiter row was
/// lost): releases and [`WAKE_PARKED_EVERY`] wake it long before.
pub(super) const PARK_BACKSTOP: Duration = Duration::from_secs(300);

/// How long a slot counts between renewals where a delivery has no lease that runs out
/// (RabbitMQ: it is held until acked or its connection drops, and then comes back at
/// once): a dead worker's slot must not keep its own job waiting for long. Elsewhere a
/// slot counts as long as the lease, which is what a dead worker's job waits for anyway.
const SLOT_HOLD_WITHOUT_LEASE: Duration = Duration::from_secs(10);

/// How much sooner than its hold a slot is treated as run out (clock drift, a slow
/// statement).
const RENEW_MARGIN: Duration = Duration::from_millis(500);

/// How often a worker wakes parked jobs whose keys' slots ran out rather than being
/// released (their holders died).
const WAKE_PARKED_EVERY: Duration = Duration::from_secs(2);

/// What taking a job's limits came to.
pub(super) enum Taken {
    /// The job is not limited.
    Free,
    /// It holds slots or tokens under this lease: renew and free them.
    Held(HeldLease),
    /// A limit held it back: it is back in its queue.
    HeldBack,
}

/// The lease a job's slots belong to, kept past the reservation's settlement.
pub(super) struct HeldLease {
    queue: String,
    id: String,
    token: String,
    /// When the slots were last taken or renewed.
    pub(super) renewed: std::time::Instant,
    /// How long they count from then.
    pub(super) hold: Duration,
}

impl HeldLease {
    /// Whether the slots surely still count: taken or renewed well within their hold.
    pub(super) fn still_held(&self) -> bool {
        self.renewed.elapsed() < self.hold / 2
    }

    /// How often the slots are renewed: three times a hold.
    pub(super) fn renew_every(&self) -> Duration {
        (self.hold / 3).max(Duration::from_millis(10))
    }

    fn lease(&self) -> LimitLease<'_> {
        LimitLease {
            queue: &self.queue,
            id: &self.id,
            token: &self.token,
        }
    }
}

impl Worker {
    /// Limits `limit` the jobs of this worker, across every worker that declares the same
    /// (see [`crate::limit`]). Kept in the status store given by
    /// [`for_jobs`](Worker::for_jobs) or [`with_status`](Worker::with_status) (a SQL
    /// store), unless [`with_limit_store`](Worker::with_limit_store) names another.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.options.limits.push(limit);
        self
    }

    /// Keeps the slots and buckets of this worker's limits in `store`.
    pub fn with_limit_store(mut self, store: Arc<dyn LimitStore>) -> Self {
        self.limit_store = Some(store);
        self
    }

    /// Checks the limits and finds their store.
    pub(super) fn check_limits(&mut self) -> Result<()> {
        if self.options.limits.is_empty() {
            return Ok(());
        }
        for limit in &self.options.limits {
            limit.check()?;
        }
        if self.limit_store.is_none() {
            self.limit_store = self.status.as_ref().and_then(|s| s.limits());
        }
        if self.limit_store.is_none() {
            return Err(Error::Config(ConfigError::new(
                "worker limits",
                Some(format!("{} limit(s)", self.options.limits.len())),
                "a store to keep them in: a SQL status store (Worker::for_jobs over \
                 PostgreSQL, MySQL or SQLite, or RabbitMQ with a control store)",
            )));
        }
        Ok(())
    }

    /// Takes `r`'s slots and tokens, or sends it back to wait.
    pub(super) async fn take_limits(&self, r: &Reservation) -> Taken {
        let Some(store) = &self.limit_store else {
            return Taken::Free;
        };
        let env = &r.envelope;
        let wants: Vec<Want> = self
            .options
            .limits
            .iter()
            .filter_map(|l| l.key_of(env).map(|key| l.want(key)))
            .collect();
        if wants.is_empty() {
            return Taken::Free;
        }
        let held = HeldLease {
            queue: env.queue.to_string(),
            id: env.id.to_string(),
            // A token of its own, not the transport's: RabbitMQ's lease tokens (consumer
            // generation and delivery tag) repeat across processes, and a redelivered
            // job must never pass for the lease that held its slot before.
            token: uuid::Uuid::new_v4().to_string(),
            renewed: std::time::Instant::now(),
            hold: if self.transport.capabilities().lease_expiry {
                r.lease
            } else {
                r.lease.min(SLOT_HOLD_WITHOUT_LEASE)
            },
        };
        // Only a slot is held past the start; a token is spent at it.
        let holds = wants.iter().any(|w| w.concurrency.is_some());
        let acquired =
            acquire_in_turn(&self.limit_turns, store, held.lease(), held.hold, &wants).await;
        let (wait, by) = match acquired {
            Ok(Acquired::Granted) if holds => return Taken::Held(held),
            Ok(Acquired::Granted) => return Taken::Free,
            Ok(Acquired::Wait {
                after,
                by: Denial::Concurrency,
            }) if self.transport.capabilities().limit_parking => {
                match self.park(store.as_ref(), &held, r, &wants).await {
                    Parked::Parked => return Taken::HeldBack,
                    // A slot freed since the denial: back almost at once.
                    Parked::Free => (MIN_WAIT, Denial::Concurrency.as_str()),
                    Parked::NotHere => (after, Denial::Concurrency.as_str()),
                }
            }
            Ok(Acquired::Wait { after, by }) => (after, by.as_str()),
            Err(err) => {
                tracing::warn!(error = %err, "the limit store failed; the job waits and tries again");
                (STORE_DOWN_WAIT, "store_failed")
            }
        };
        let wait = wait.max(MIN_WAIT);
        crate::metrics::limited(self.tenant.as_deref(), &env.queue, &env.kind, by);
        match self.transport.snooze(r, wait).await {
            Ok(()) => {
                tracing::debug!(retry_in = ?wait, limit = by, "held back by a limit");
                // The fetch loop of an idle queue polls a second apart at most: it is
                // woken when the job is due, so that a booked start is taken on time.
                if let Some(wake) = self.transport.wake_signal(&self.queue) {
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        wake.notify_waiters();
                    });
                }
            }
            Err(err) => self.log_settle_error("limit wait", &err),
        }
        Taken::HeldBack
    }

    /// Parks `r` until a slot of its saturated key frees; otherwise it is still to be put
    /// back (`Free`: a slot freed meanwhile; `NotHere`: the store cannot park it, or
    /// failed).
    async fn park(
        &self,
        store: &dyn LimitStore,
        held: &HeldLease,
        r: &Reservation,
        wants: &[Want],
    ) -> Parked {
        let token = r.token().to_string();
        match store.park(held.lease(), &token, wants, PARK_BACKSTOP).await {
            Ok(Parked::Parked) => {
                let env = &r.envelope;
                crate::metrics::limited(
                    self.tenant.as_deref(),
                    &env.queue,
                    &env.kind,
                    "concurrency",
                );
                tracing::debug!("parked by a concurrency limit until a slot frees");
                Parked::Parked
            }
            Ok(other) => other,
            Err(err) => {
                tracing::warn!(error = %err, "parking the job failed; it waits and tries again");
                Parked::NotHere
            }
        }
    }

    /// Wakes, every [`WAKE_PARKED_EVERY`] until `stop`, the jobs parked under keys whose
    /// slots ran out with their holders; `None` when this worker parks none.
    pub(super) fn spawn_wake_parked(
        self: &Arc<Self>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let store = self.limit_store.clone()?;
        let parks = self.options.limits.iter().any(Limit::has_concurrency)
            && self.transport.capabilities().limit_parking;
        if !parks {
            return None;
        }
        let wake = self.transport.wake_signal(&self.queue);
        Some(tokio::spawn(async move {
            loop {
                let pause = WAKE_PARKED_EVERY.mul_f64(0.75 + fastrand::f64() / 2.0);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                match store.wake_parked().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::debug!(woken = n, "woke jobs parked under slots that ran out");
                        if let Some(wake) = &wake {
                            wake.notify_waiters();
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "waking parked jobs failed; trying again later")
                    }
                }
            }
        }))
    }

    /// Renews `held`'s slots for another hold; `false` when they are lost: another
    /// lease may have them, or the store could not renew them before they ran out.
    pub(super) async fn renew_limits(&self, held: &mut HeldLease) -> bool {
        let Some(store) = &self.limit_store else {
            return true;
        };
        let asked = std::time::Instant::now();
        // A renewal that cannot finish before the slots run out is as good as lost: it
        // is not waited for past that.
        let left = held
            .hold
            .saturating_sub(held.renewed.elapsed())
            .saturating_sub(RENEW_MARGIN);
        match tokio::time::timeout(left, store.extend(held.lease(), held.hold)).await {
            Ok(Ok(true)) => {
                // From when it was asked: the store's hold ran from no earlier.
                held.renewed = asked;
                true
            }
            Ok(Ok(false)) => false,
            failed => {
                // The slots count until the last renewal's hold ends; the run may go on
                // only while they surely count until the next try.
                let kept = held.renewed.elapsed() + held.renew_every() + RENEW_MARGIN < held.hold;
                match failed {
                    Ok(Err(err)) => {
                        tracing::warn!(error = %err, kept, "renewing the job's limit slots failed")
                    }
                    _ => tracing::warn!(
                        kept,
                        "renewing the job's limit slots did not finish in time"
                    ),
                }
                kept
            }
        }
    }

    /// Frees `held`'s slots (a failure leaves them to run out with the lease).
    pub(super) async fn free_limits(&self, held: &HeldLease) {
        if let Some(store) = &self.limit_store {
            match store.release(held.lease()).await {
                Ok(0) => {}
                // A job woken here is due now: this worker's fetch loop need not wait
                // for its next poll to see it.
                Ok(_) => {
                    if let Some(wake) = self.transport.wake_signal(&self.queue) {
                        wake.notify_waiters();
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "freeing the job's limit slots failed; they run out with its lease");
                }
            }
        }
    }
}
