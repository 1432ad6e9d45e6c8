//! The fetcher: claims batches of messages into the dispatcher's buffer while there is
//! room, backs off while the queue is empty and wakes on the transport's signal; and
//! the state the dispatcher shares with it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::acker::Acker;
use super::builder::Worker;
use crate::error::Error;
use crate::error::Result;
use crate::reservation::Reservation;
use crate::transport::Claim;
use crate::transport_ext::TransportExt;

/// What the dispatcher tells the fetcher about the messages it holds.
#[derive(Debug, Default)]
pub(super) struct DispatchState {
    /// Set while the dispatcher holds a free slot and waits for a message.
    pub(super) waiting: AtomicBool,
    /// Marked messages waiting for a slot: the fetcher counts them as buffered.
    pub(super) marked: AtomicUsize,
    /// Claimed messages the dispatcher holds back behind a suspect: buffered too.
    pub(super) stashed: AtomicUsize,
    /// Set while a suspect waits to run or runs alone: claims start nothing then.
    pub(super) quiet: AtomicBool,
    /// Claims in flight that start fresh messages as they claim them, until what they
    /// brought is in the channel.
    pub(super) starting: AtomicUsize,
}

/// Counts a starting claim as done when dropped: after its messages were sent into the
/// channel, or when it brought none.
pub(super) struct StartingClaim<'a> {
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
pub(super) async fn wait_for_starting_claims(
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

/// What one claim brought back: messages, each with whether the claim started it.
pub(super) type ClaimOutcome = Result<Vec<(Reservation, bool)>>;

/// A claimed message, with when its claim marked it started (`None`: not started yet).
pub(super) type Claimed = (Reservation, Option<std::time::Instant>);

/// Most claims in flight at once.
const MAX_IN_FLIGHT: usize = 2;

/// Claims batches into the buffer while there is room; backs off while the queue is
/// empty and wakes at once on the transport's signal. Ends on shutdown, or in drain
/// mode once the queue is empty and nothing is in flight.
///
/// One claim is in flight at a time while the queue is idle; while it has a backlog (the
/// last claim came back full) and handlers are fast, a second claim overlaps the first, so
/// handlers do not wait out a whole round trip between batches.
pub(super) struct Fetcher {
    pub(super) links: Links,
    pub(super) tx: mpsc::Sender<Claimed>,
}

/// What the fetcher and the dispatcher of one run share.
#[derive(Clone)]
pub(super) struct Links {
    pub(super) worker: Arc<Worker>,
    pub(super) shutdown: CancellationToken,
    /// The handler slots.
    pub(super) slots: Arc<Semaphore>,
    pub(super) acker: Acker,
    /// Told when a handler ends: room for a claim.
    pub(super) finished: Arc<Notify>,
    pub(super) dispatch: Arc<DispatchState>,
}

/// The claims in flight, and the pacing between them.
struct Flight {
    /// Each claim: how many it asked for, whether it starts what it claims, and what
    /// it brought.
    claims: JoinSet<(usize, bool, ClaimOutcome)>,
    /// How many each claim in flight asked for, and whether it starts what it claims,
    /// so that a claim task that panicked still gives its share of the buffer back.
    asked_by: HashMap<tokio::task::Id, (usize, bool)>,
    /// Asked for by the claims in flight: counted as buffered.
    asked: usize,
    /// The last claim came back full.
    backlog: bool,
    /// The wake-up registered before the first claim of an idle spell.
    notified: Option<Pin<Box<OwnedNotified>>>,
    /// The pause after an empty claim, doubling up to the poll maximum.
    pause: Duration,
}

/// What the loop does after a claim came back.
enum Next {
    Claim,
    Stop,
}

impl Fetcher {
    /// Runs the loop until shutdown or, in drain mode, an empty queue.
    pub(super) async fn run(self) {
        let opts = &self.links.worker.options;
        let waker = self
            .links
            .worker
            .transport
            .wake_signal(&self.links.worker.queue);
        let mut flight = Flight {
            claims: JoinSet::new(),
            asked_by: HashMap::new(),
            asked: 0,
            backlog: false,
            notified: None,
            pause: opts.poll_min,
        };
        loop {
            if self.links.shutdown.is_cancelled() || self.tx.is_closed() {
                break;
            }
            let limit = self.limit(&flight);
            if flight.claims.len() < limit {
                if let Some(room) = self.room(&flight) {
                    self.spawn_claim(&mut flight, room, waker.as_ref());
                    continue;
                }
            }
            let joined = tokio::select! {
                biased;
                _ = self.links.shutdown.cancelled() => break,
                joined = flight.claims.join_next_with_id(), if !flight.claims.is_empty() => joined,
                // Room for a claim: a job finished, or the buffer drained as jobs started.
                _ = self.links.finished.notified(), if flight.claims.len() < limit => continue,
                _ = tokio::time::sleep(opts.poll_min.max(Duration::from_millis(1))), if flight.claims.len() < limit => continue,
            };
            let (n, starts, claimed) = match joined {
                Some(Ok((id, done))) => {
                    flight.asked_by.remove(&id);
                    done
                }
                // What a panicked claim took stays leased until its lease runs out.
                Some(Err(err)) => {
                    tracing::error!(error = %err, "a claim task failed");
                    let (n, starts) = flight.asked_by.remove(&err.id()).unwrap_or((0, false));
                    flight.asked = flight.asked.saturating_sub(n);
                    if starts {
                        self.links.dispatch.starting.fetch_sub(1, Ordering::SeqCst);
                    }
                    continue;
                }
                None => continue,
            };
            // Whatever this claim started is in the channel once this is released.
            let _started_sent = StartingClaim {
                dispatch: &self.links.dispatch,
                starts,
            };
            flight.asked = flight.asked.saturating_sub(n);
            let next = match claimed {
                Ok(batch) if !batch.is_empty() => self.send(&mut flight, batch, n).await,
                Ok(_) => self.idle(&mut flight).await,
                Err(err) => self.failed(&mut flight, &err).await,
            };
            if let Next::Stop = next {
                break;
            }
        }
        self.give_back_in_flight(&mut flight).await;
    }

    /// How many claims may be in flight: two while there is a backlog and handlers are
    /// fast; one otherwise, and always for a single handler, which gets its messages
    /// strictly in order.
    fn limit(&self, flight: &Flight) -> usize {
        let fast = self.links.worker.counters.handlers_are_fast();
        if flight.backlog && fast && self.links.worker.options.concurrency.max(1) > 1 {
            MAX_IN_FLIGHT
        } else {
            1
        }
    }

    /// How many to claim now, if enough: while handlers are fast, a whole batch into the
    /// buffer; while they are slow, only what free handlers can start now. Claims in
    /// flight count as buffered.
    fn room(&self, flight: &Flight) -> Option<usize> {
        let opts = &self.links.worker.options;
        let fast = self.links.worker.counters.handlers_are_fast();
        // While handlers are slow, messages marked and waiting in the dispatcher count
        // too, so that a slow worker claims no more than its free slots.
        let waiting_marked = if fast {
            0
        } else {
            self.links.dispatch.marked.load(Ordering::SeqCst)
        };
        let buffered = self.tx.max_capacity() - self.tx.capacity()
            + waiting_marked
            + self.links.dispatch.stashed.load(Ordering::SeqCst)
            + flight.asked;
        let ahead = if fast { opts.prefetch } else { 0 };
        let room = (self.free_slots() + ahead)
            .saturating_sub(buffered)
            .min(self.tx.capacity().saturating_sub(flight.asked));
        // While handlers are fast, wait for half a batch of room so that one commit
        // claims several messages; slow handlers get theirs at once.
        let least = if fast {
            (opts.concurrency.max(1) / 2).max(1)
        } else {
            1
        };
        (room >= least).then_some(room)
    }

    /// Free handler slots, counting the one the dispatcher holds while it waits.
    fn free_slots(&self) -> usize {
        self.links.slots.available_permits()
            + usize::from(self.links.dispatch.waiting.load(Ordering::SeqCst))
    }

    /// Starts a claim of `room` messages.
    fn spawn_claim(&self, flight: &mut Flight, room: usize, waker: Option<&Arc<Notify>>) {
        if flight.claims.is_empty() {
            // Register for the wake-up before reserving, so a publish in between is seen.
            let mut n = waker.map(|n| Box::pin(n.clone().notified_owned()));
            if let Some(n) = n.as_mut() {
                n.as_mut().enable();
            }
            flight.notified = n;
        }
        let (transport, queue) = (
            self.links.worker.transport.clone(),
            self.links.worker.queue.clone(),
        );
        let (holder, labels) = (
            self.links.worker.holder.clone(),
            self.links.worker.labels.clone(),
        );
        let dispatch = &self.links.dispatch;
        // Counted before `quiet` is read, so that a dispatcher that set `quiet` and then
        // saw no starting claim can be sure none begins after.
        let starts = self.links.worker.counters.handlers_are_fast() && {
            dispatch.starting.fetch_add(1, Ordering::SeqCst);
            let quiet = dispatch.quiet.load(Ordering::SeqCst);
            if quiet {
                dispatch.starting.fetch_sub(1, Ordering::SeqCst);
            }
            !quiet
        };
        let worker = self.links.worker.clone();
        let handle = flight.claims.spawn(async move {
            // A paused queue claims nothing: the loop backs off as from an empty claim,
            // and looks again at the next poll.
            if worker.queue_paused() {
                return (room, starts, Ok(Vec::new()));
            }
            // While handlers keep up, messages start as they are claimed (one round trip
            // fewer per batch); a crash then charges them an attempt each, at most once,
            // because a message with attempts is never started by its claim.
            let claim = if starts {
                Claim::prefetch_starting_fresh(room)
            } else {
                Claim::prefetch(room)
            }
            .by(&holder)
            .with_labels(&labels);
            let claimed = transport.claim(&queue, claim).await.map(|batch| {
                batch
                    .into_iter()
                    .map(|r| {
                        let started = starts && r.started;
                        (r, started)
                    })
                    .collect()
            });
            (room, starts, claimed)
        });
        flight.asked_by.insert(handle.id(), (room, starts));
        flight.asked += room;
    }

    /// Sends a claimed batch to the dispatcher.
    async fn send(
        &self,
        flight: &mut Flight,
        batch: Vec<(Reservation, bool)>,
        asked: usize,
    ) -> Next {
        flight.pause = self.links.worker.options.poll_min;
        for (r, _) in &batch {
            let env = &r.envelope;
            crate::metrics::count(
                crate::metrics::RESERVED,
                self.links.worker.tenant.as_deref(),
                &env.queue,
                &env.kind,
                1,
            );
        }
        flight.backlog = batch.len() >= asked;
        let at = std::time::Instant::now();
        for (reservation, started) in batch {
            if let Err(mpsc::error::SendError((r, _))) =
                self.tx.send((reservation, started.then_some(at))).await
            {
                // The dispatcher stopped: the worker is shutting down.
                give_back(&self.links.worker, &r).await;
            }
        }
        Next::Claim
    }

    /// An empty claim: in drain mode with nothing in flight, the end; else a pause that
    /// the transport's wake-up cuts short.
    async fn idle(&self, flight: &mut Flight) -> Next {
        flight.backlog = false;
        if !flight.claims.is_empty() {
            return Next::Claim;
        }
        let opts = &self.links.worker.options;
        let idle = self.free_slots() == opts.concurrency.max(1)
            && self.tx.capacity() == self.tx.max_capacity()
            && self.links.dispatch.stashed.load(Ordering::SeqCst) == 0
            && self.links.acker.is_idle();
        if opts.drain && idle && self.links.worker.queue_is_empty().await {
            return Next::Stop;
        }
        let wake = flight.notified.take();
        tokio::select! {
            _ = self.links.shutdown.cancelled() => return Next::Stop,
            _ = tokio::time::sleep(flight.pause) => {}
            _ = async { if let Some(n) = wake { n.await } else { std::future::pending().await } } => {}
        }
        flight.pause = (flight.pause * 2).min(opts.poll_max);
        Next::Claim
    }

    /// A failed claim: logged, and retried after a pause that backs off to at least 5 s.
    async fn failed(&self, flight: &mut Flight, err: &Error) -> Next {
        let opts = &self.links.worker.options;
        flight.backlog = false;
        tracing::warn!(queue = %self.links.worker.queue, error = %err, retry_in = ?flight.pause, "reserve failed");
        if flight.claims.is_empty() {
            tokio::select! {
                _ = self.links.shutdown.cancelled() => return Next::Stop,
                _ = tokio::time::sleep(flight.pause) => {}
            }
        }
        flight.pause = (flight.pause * 2).min(opts.poll_max.max(Duration::from_secs(5)));
        Next::Claim
    }

    /// What claims still in flight bring back goes back at once, uncharged.
    async fn give_back_in_flight(&self, flight: &mut Flight) {
        while let Some(joined) = flight.claims.join_next().await {
            if let Ok((_, starts, outcome)) = joined {
                if starts {
                    self.links.dispatch.starting.fetch_sub(1, Ordering::SeqCst);
                }
                let Ok(batch) = outcome else { continue };
                for (r, _) in batch {
                    give_back(&self.links.worker, &r).await;
                }
            }
        }
    }
}

/// Gives back a message that was claimed but never started.
pub(super) async fn give_back(worker: &Worker, r: &Reservation) {
    if let Err(err) = worker.transport.abandon(r).await {
        worker.log_settle_error("give back", &err);
    }
}
