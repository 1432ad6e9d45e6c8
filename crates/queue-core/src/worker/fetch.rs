//! The fetcher: claims batches of messages into the dispatcher's buffer while there is
//! room, backs off while the queue is empty and wakes on the transport's signal; and
//! the state the dispatcher shares with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::acker::Acker;
use super::Worker;
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

/// Claims batches into the buffer while there is room; backs off while the queue is
/// empty and wakes at once on the transport's signal. Ends on shutdown, or in drain
/// mode once the queue is empty and nothing is in flight.
///
/// One claim is in flight at a time while the queue is idle; while it has a backlog (the
/// last claim came back full) and handlers are fast, a second claim overlaps the first, so
/// handlers do not wait out a whole round trip between batches.
pub(super) async fn fetch_loop(
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
    let waker = worker.transport.wake_signal(&worker.queue);
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
                    let claim = if starts {
                        Claim::prefetch_starting_fresh(room)
                    } else {
                        Claim::prefetch(room)
                    };
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
pub(super) async fn give_back(worker: &Worker, r: &Reservation) {
    if let Err(err) = worker.transport.abandon(r).await {
        worker.log_settle_error("give back", &err);
    }
}
