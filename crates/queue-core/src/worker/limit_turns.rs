//! Turns at the limit store for the jobs of one worker: its jobs take their limits in
//! batches, one transaction per key at a time, and a job that arrives while a batch
//! runs joins the next (a group commit).

use std::sync::Arc;
use std::time::Duration;

use crate::limit::{Acquired, Want};
use crate::limit_store::{LimitLease, LimitStore};

/// How many turns a worker keeps (keys share them by hash).
const TURNS: usize = 32;

/// How many jobs one transaction takes limits for at most.
const MOST_PER_BATCH: usize = 64;

/// Turns at the limit store for the jobs of one worker. Keys share 32 turns by hash;
/// the jobs of a turn take their limits one batch at a time per process (a transaction
/// per set of keys), and a job that arrives while a batch runs joins the next: a burst of 1,000 jobs under a rate is booked in a few dozen commits
/// rather than 1,000, with one transaction per process queued on the key's row lock
/// rather than every handler. (One commit per job, on two cores, took long enough that
/// the first booked starts came back late and were lost.)
#[derive(Debug)]
pub(super) struct Turns {
    turns: Vec<Turn>,
}

/// One turn: who runs the next batch, and the jobs waiting for it.
#[derive(Debug, Default)]
struct Turn {
    running: tokio::sync::Mutex<()>,
    asks: std::sync::Mutex<Vec<Ask>>,
}

/// A job waiting to take its limits, and where its answer goes.
#[derive(Debug)]
struct Ask {
    queue: String,
    id: String,
    token: String,
    hold: Duration,
    wants: Vec<Want>,
    reply: tokio::sync::oneshot::Sender<std::result::Result<Acquired, String>>,
}

impl Default for Turns {
    fn default() -> Self {
        Turns {
            turns: (0..TURNS).map(|_| Turn::default()).collect(),
        }
    }
}

impl Turns {
    /// The turn of the jobs that want `wants` (by their first key).
    fn of(&self, wants: &[Want]) -> &Turn {
        let key = wants.iter().map(|w| w.key.as_str()).min().unwrap_or("");
        let i = (crate::stable_hash::fnv1a(key.as_bytes()) % self.turns.len() as u64) as usize;
        &self.turns[i]
    }
}

/// Takes the limits of `lease` in its turn: joins the next batch, and runs it when no
/// other job of the turn is running one.
pub(super) async fn acquire_in_turn(
    turns: &Turns,
    store: &Arc<dyn LimitStore>,
    lease: LimitLease<'_>,
    hold: Duration,
    wants: &[Want],
) -> std::result::Result<Acquired, String> {
    let turn = turns.of(wants);
    let (reply, mut answer) = tokio::sync::oneshot::channel();
    turn.asks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Ask {
            queue: lease.queue.to_owned(),
            id: lease.id.to_owned(),
            token: lease.token.to_owned(),
            hold,
            wants: wants.to_vec(),
            reply,
        });
    loop {
        tokio::select! {
            biased;
            got = &mut answer => {
                return got.unwrap_or_else(|_| Err("the batch taking this job's limits was dropped".into()));
            }
            running = turn.running.lock() => {
                // Asked before this lock was taken: the job is in this batch, or was in
                // one that already answered.
                let asks = std::mem::take(&mut *turn.asks.lock().unwrap_or_else(|e| e.into_inner()));
                // A task of its own: a leader dropped mid-batch (its worker stopping) still
                // answers the jobs that joined it.
                let _ = tokio::spawn(run_batches(store.clone(), asks)).await;
                drop(running);
            }
        }
    }
}

/// Takes the limits of `asks`, a transaction per set of keys (so that one transaction
/// never locks two keys in another order than a second one) and per [`MOST_PER_BATCH`].
async fn run_batches(store: Arc<dyn LimitStore>, mut asks: Vec<Ask>) {
    let keys_of = |a: &Ask| {
        let mut keys: Vec<&str> = a.wants.iter().map(|w| w.key.as_str()).collect();
        keys.sort_unstable();
        keys.join("\u{1f}")
    };
    asks.sort_by_cached_key(keys_of);
    while !asks.is_empty() {
        let first = keys_of(&asks[0]);
        let n = asks
            .iter()
            .take(MOST_PER_BATCH)
            .take_while(|a| keys_of(a) == first)
            .count();
        let group: Vec<Ask> = asks.drain(..n).collect();
        let batch: Vec<(LimitLease<'_>, Duration, &[Want])> = group
            .iter()
            .map(|a| {
                let lease = LimitLease {
                    queue: &a.queue,
                    id: &a.id,
                    token: &a.token,
                };
                (lease, a.hold, a.wants.as_slice())
            })
            .collect();
        let answers = store.acquire_batch(&batch).await;
        drop(batch);
        match answers {
            Ok(answers) if answers.len() == group.len() => {
                for (ask, answer) in group.into_iter().zip(answers) {
                    let _ = ask.reply.send(Ok(answer));
                }
            }
            Ok(_) => {
                for ask in group {
                    let _ = ask
                        .reply
                        .send(Err("the limit store answered a batch short".into()));
                }
            }
            Err(err) => {
                let err = err.to_string();
                for ask in group {
                    let _ = ask.reply.send(Err(err.clone()));
                }
            }
        }
    }
}
