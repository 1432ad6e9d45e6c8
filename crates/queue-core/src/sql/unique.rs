//! Unique keys on a SQL store: what a publish of a message with a unique key does, inside
//! the publish's own transaction, over a backend's statements ([`KeyStatements`]).
//!
//! Each backend keeps a key table beside the queue's: one row per (queue, key) naming
//! the job that last took the key, its scope, when it took it, and until when the key
//! stays held whatever that job's state (a throttle's `ttl`, or a `done` scope's period
//! set by the job's ack). The row is locked while a publish decides, so publishers of one
//! key are serialised by the table's primary key, never by a lock that outlives a
//! transaction.
//!
//! Whether the named job still holds the key is read from the job's own row when a
//! publish meets the key: waiting (not claimed), claimed, or gone (acked, dead-lettered,
//! moved). Nothing has to clear a key when its job ends, so a crash cannot leave a key
//! held: a key row whose job is gone and whose hold has run out is simply taken over.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::error::{DecodeError, Error, Result};
use crate::published::{Duplicate, Published};
use crate::time_units::{micros, micros_between};
use crate::unique::{OnConflict, Unique, UniqueScope};

/// How long after a job took a key its row may be deleted once it holds nothing: a
/// publish taking a row over must have committed by then.
pub const PRUNE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// How many times a publish looks at a key again after a race it lost (another
/// publisher created the key row first, or a claim took the job it was replacing).
const ROUNDS: usize = 4;

/// A key's row, locked by [`KeyStatements::lock_key`].
#[derive(Debug, Clone)]
pub struct KeyRow {
    /// The job that took the key.
    pub id: String,
    /// Its scope, as stored ([`scope_name`]).
    pub scope: String,
    /// Whether the key is held whatever the job's state (the hold has not run out).
    pub held: bool,
    /// How long ago the job took the key, in microseconds.
    pub age_us: i64,
    /// Whether a broker's job counts as gone: its publish was never confirmed in time,
    /// it expired, or it was acked (its `done` period is `held`).
    pub gone: bool,
}

/// The state of the job a key row names, read from the job's row.
#[derive(Debug, Clone)]
pub enum KeyHolder {
    /// No such job: acked, dead-lettered or moved away.
    Gone,
    /// Waiting for a worker, with its stored envelope.
    Waiting(String),
    /// Claimed by a worker (running, or held ahead of its start).
    Claimed,
}

/// A key row to write: `id` takes the key of `queue` now.
#[derive(Debug, Clone, Copy)]
pub struct TakeKey<'a> {
    /// The queue.
    pub queue: &'a str,
    /// The key.
    pub key: &'a str,
    /// The job that takes it.
    pub id: &'a str,
    /// Its scope ([`scope_name`]).
    pub scope: &'static str,
    /// Microseconds from now that the key stays held whatever the job's state (a
    /// throttle's ttl), or `None`.
    pub hold_us: Option<i64>,
    /// For a broker's message: microseconds from now after which its job counts as gone
    /// (until the broker confirms the publish).
    pub gone_after_us: Option<i64>,
}

/// An acked job's key to hold for its `done` period, fenced by the job's lease.
#[derive(Debug, Clone)]
pub struct KeyHold {
    /// The queue.
    pub queue: String,
    /// The key.
    pub key: String,
    /// The job.
    pub id: String,
    /// The lease token the job is held under.
    pub token: Uuid,
    /// How long to hold the key from now, in microseconds.
    pub period_us: i64,
}

/// A backend's statements on its key table and on the job rows keys name, run on the
/// publish's transaction.
#[async_trait]
pub trait KeyStatements: Send {
    /// Whether a job with this id is stored, live or dead (a publish of it stores
    /// nothing new and takes no key).
    async fn id_stored(&mut self, id: &str) -> Result<bool>;

    /// The key's row, locked until the transaction ends; `None` when there is none.
    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>>;

    /// Creates the key's row; `false` when another transaction created it first.
    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool>;

    /// Points the locked key row at a new job.
    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()>;

    /// The state of the job `row` names.
    async fn holder(&mut self, row: &KeyRow) -> Result<KeyHolder>;

    /// Stores jobs, as a publish without unique keys would, in their order.
    async fn insert_jobs(&mut self, envelopes: Vec<Envelope>) -> Result<()>;

    /// Replaces the stored envelope of the job `id` and makes it due `due_us` from now,
    /// if no worker has claimed it; whether it did.
    async fn replace_job(&mut self, id: &str, envelope: &str, due_us: i64) -> Result<bool>;

    /// Which of `ids` are stored, live or dead; by default one
    /// [`id_stored`](Self::id_stored) each.
    async fn ids_stored(&mut self, ids: &[&str]) -> Result<HashSet<String>> {
        let mut stored = HashSet::new();
        for id in ids {
            if self.id_stored(id).await? {
                stored.insert((*id).to_owned());
            }
        }
        Ok(stored)
    }

    /// Creates the rows of `takes`' keys where no row exists, in a few statements for
    /// them all; the ids of the jobs whose rows it created, which then hold their keys
    /// as [`insert_key`](Self::insert_key) would have made them. It may create fewer,
    /// down to none (the default): the others are taken one at a time.
    async fn insert_new_keys(&mut self, _takes: &[TakeKey<'_>]) -> Result<HashSet<String>> {
        Ok(HashSet::new())
    }
}

/// The stored name of a scope.
pub fn scope_name(scope: UniqueScope) -> &'static str {
    match scope {
        UniqueScope::Pending => "pending",
        UniqueScope::Active => "active",
        UniqueScope::Done => "done",
    }
}

/// How long a broker's confirmed message holds its key at the most: the broker can drop
/// a message without the transport seeing it (a quorum queue's delivery limit, a purge,
/// a deleted queue), and nothing would then free its key.
pub const BROKER_HOLD: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 60 * 60);

/// Microseconds from now that a broker's confirmed message holds its key unless its job
/// ends first: until it expires (an expired message never reaches a worker to end its
/// job), and no longer than [`BROKER_HOLD`].
pub fn held_on_broker_us(env: &Envelope) -> Option<i64> {
    let most = micros(BROKER_HOLD);
    Some(
        env.expires_at
            .map_or(most, |t| micros_between(Utc::now(), t).clamp(0, most)),
    )
}

/// The keys of `reservations`' jobs whose scope holds them for a period after the ack.
pub fn holds_after_ack(reservations: &[crate::Reservation]) -> Vec<KeyHold> {
    reservations
        .iter()
        .filter_map(|r| {
            let unique = r.envelope.unique.as_ref()?;
            let period = unique.period()?;
            Some(KeyHold {
                queue: r.envelope.queue.as_str().to_owned(),
                key: unique.key.clone(),
                id: r.id().to_string(),
                token: r.token().0,
                period_us: micros(period),
            })
        })
        .collect()
}

/// Publishes `env`, which has a unique key, on `s`'s transaction: stores it and takes the
/// key, or, when another job holds the key, stores nothing (or debounces that job) and
/// says which job holds it.
///
/// A broker's message (`gone_after_us` set) is published after the transaction
/// commits; see [`TakeKey::gone_after_us`].
pub async fn publish_unique<S: KeyStatements + ?Sized>(
    s: &mut S,
    env: &Envelope,
    gone_after_us: Option<i64>,
) -> Result<Option<Duplicate>> {
    let Some(unique) = &env.unique else {
        s.insert_jobs(vec![env.clone()]).await?;
        return Ok(None);
    };
    let id = env.id.to_string();
    if s.id_stored(&id).await? {
        return Ok(None);
    }
    let queue = env.queue.as_str();
    let take = TakeKey {
        queue,
        key: &unique.key,
        id: &id,
        scope: scope_name(unique.scope),
        hold_us: unique.ttl().map(micros),
        gone_after_us,
    };
    for _ in 0..ROUNDS {
        let Some(row) = s.lock_key(queue, &unique.key).await? else {
            if s.insert_key(take).await? {
                s.insert_jobs(vec![env.clone()]).await?;
                return Ok(None);
            }
            continue;
        };
        if gone_after_us.is_some() && row.id == id {
            // A broker's publish of this very message again (a retry after a failed or
            // unconfirmed send): it takes its key afresh and goes out again.
            s.move_key(take).await?;
            return Ok(None);
        }
        let holder = s.holder(&row).await?;
        let holds = row.held
            || match &holder {
                KeyHolder::Gone => false,
                KeyHolder::Waiting(_) => true,
                KeyHolder::Claimed => row.scope != scope_name(UniqueScope::Pending),
            };
        if !holds {
            s.move_key(take).await?;
            s.insert_jobs(vec![env.clone()]).await?;
            return Ok(None);
        }
        let existing = Uuid::parse_str(&row.id).map_err(|e| {
            Error::Decode(DecodeError::new(format!(
                "the unique key {} of queue {queue} names job {}, which is not a message id: {e}",
                crate::error::shown(&unique.key),
                crate::error::shown(&row.id)
            )))
        })?;
        if let (OnConflict::Replace, KeyHolder::Waiting(stored)) = (unique.on_conflict, &holder) {
            if let Some((json, due_us)) = debounced(stored, env, unique, row.age_us) {
                if s.replace_job(&row.id, &json, due_us).await? {
                    return Ok(Some(Duplicate {
                        id: env.id,
                        existing,
                        replaced: true,
                    }));
                }
                // A worker claimed it meanwhile: look again.
                continue;
            }
        }
        return Ok(Some(Duplicate {
            id: env.id,
            existing,
            replaced: false,
        }));
    }
    Err(Error::backend(
        "unique keys",
        true,
        format!(
            "the unique key {} of queue {queue} kept changing hands while message {} was published; publish it again",
            crate::error::shown(&unique.key),
            env.id
        ),
    ))
}

/// Publishes `envelopes`, some with unique keys, on `s`'s transaction, in their order:
/// each run of messages without keys, or whose keys [`take_new_keys`] took, as one
/// batch, each other message with a key through [`publish_unique`] (so a batch keeps
/// its publish order, which ordering keys rely on).
pub async fn publish_in_order<S: KeyStatements + ?Sized>(
    s: &mut S,
    envelopes: Vec<Envelope>,
) -> Result<Published> {
    let taken = take_new_keys(s, &envelopes).await?;
    let mut published = Published::all_stored();
    let mut plain = Vec::new();
    for (env, taken) in envelopes.into_iter().zip(taken) {
        if env.unique.is_none() || taken {
            plain.push(env);
            continue;
        }
        if !plain.is_empty() {
            s.insert_jobs(std::mem::take(&mut plain)).await?;
        }
        if let Some(dup) = publish_unique(s, &env, None).await? {
            published.duplicates.push(dup);
        }
    }
    if !plain.is_empty() {
        s.insert_jobs(plain).await?;
    }
    Ok(published)
}

/// Takes, in a few statements for the whole batch, the keys of `envelopes` that no row
/// holds yet; for each message, whether its key was taken so (its job is then stored as
/// any job without a key).
///
/// What [`publish_unique`] would have found at the message's turn is what the batch
/// started with, so the outcome is the same: only the first message of a key in the
/// batch is taken so, and only where no earlier message has its id; its id is not
/// stored and its key has no row, as its first round would have needed. Everything else
/// (held keys, a key's later messages, a key another transaction created meanwhile)
/// takes its turn through [`publish_unique`]. Batches of fewer than two such messages
/// go that way whole: for one message the extra statements would gain nothing.
pub async fn take_new_keys<S: KeyStatements + ?Sized>(
    s: &mut S,
    envelopes: &[Envelope],
) -> Result<Vec<bool>> {
    let mut taken = vec![false; envelopes.len()];
    let (mut keys, mut ids) = (HashSet::new(), HashSet::new());
    let mut candidates = Vec::new();
    for (i, env) in envelopes.iter().enumerate() {
        let first_of_id = ids.insert(env.id);
        let Some(unique) = &env.unique else {
            continue;
        };
        // Every key seen counts, whatever became of its message.
        let first_of_key = keys.insert((env.queue.as_str(), unique.key.as_str()));
        if first_of_id && first_of_key {
            candidates.push((i, unique));
        }
    }
    if candidates.len() < 2 {
        return Ok(taken);
    }
    let id_texts: Vec<String> = candidates
        .iter()
        .map(|&(i, _)| envelopes[i].id.to_string())
        .collect();
    let refs: Vec<&str> = id_texts.iter().map(String::as_str).collect();
    let stored = s.ids_stored(&refs).await?;
    let mut takes = Vec::with_capacity(candidates.len());
    let mut at = Vec::with_capacity(candidates.len());
    for (&(i, unique), id) in candidates.iter().zip(&id_texts) {
        if stored.contains(id) {
            continue;
        }
        takes.push(TakeKey {
            queue: envelopes[i].queue.as_str(),
            key: &unique.key,
            id,
            scope: scope_name(unique.scope),
            hold_us: unique.ttl().map(micros),
            gone_after_us: None,
        });
        at.push(i);
    }
    if takes.is_empty() {
        return Ok(taken);
    }
    let created = s.insert_new_keys(&takes).await?;
    for (take, i) in takes.iter().zip(at) {
        taken[i] = created.contains(take.id);
    }
    Ok(taken)
}

/// The waiting job's envelope with `env`'s payload, headers and due time, the due time
/// no later than `max_wait` after the job took its key (`age_us` ago); `None` when the
/// stored envelope cannot be read (it then stays as it is).
fn debounced(stored: &str, env: &Envelope, unique: &Unique, age_us: i64) -> Option<(String, i64)> {
    let mut job = Envelope::from_json(stored).ok()?;
    if job.ordering_key.is_some() {
        // Its due time is its place in its key's order (it may be parked behind the
        // key's head): it is not moved.
        return None;
    }
    let now = Utc::now();
    let wanted = micros_between(now, env.available_at).max(0);
    let latest = unique
        .max_wait()
        .map_or(wanted, |w| micros(w).saturating_sub(age_us).max(0));
    let due_us = wanted.min(latest);
    job.payload.clone_from(&env.payload);
    job.headers.clone_from(&env.headers);
    job.trace_id.clone_from(&env.trace_id);
    job.available_at = now + chrono::TimeDelta::microseconds(due_us);
    Some((job.to_json(), due_us))
}

/// A backend's statements on its key table, for the keys of a broker's messages
/// ([`OnBroker`]).
#[async_trait]
pub trait KeyTable: Send {
    /// The key's row, locked until the transaction ends.
    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>>;

    /// Creates the key's row (`move_to` false: `false` when another transaction created
    /// it first) or points it at a new job.
    async fn write_key(&mut self, take: TakeKey<'_>, move_to: bool) -> Result<bool>;
}

/// [`KeyStatements`] for messages a broker stores: the message is published once the
/// key is committed, and the transport frees the key when its job leaves the key's
/// scope, so a key row names a waiting or running job until it counts as gone (an
/// unconfirmed publish, an expired message, an acked job's `done` period). A queued
/// message cannot be changed: a debounce finds its key held.
#[derive(Debug)]
pub struct OnBroker<T>(pub T);

#[async_trait]
impl<T: KeyTable> KeyStatements for OnBroker<T> {
    async fn id_stored(&mut self, _id: &str) -> Result<bool> {
        Ok(false)
    }

    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>> {
        self.0.lock_key(queue, key).await
    }

    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool> {
        self.0.write_key(take, false).await
    }

    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()> {
        self.0.write_key(take, true).await.map(|_| ())
    }

    async fn holder(&mut self, row: &KeyRow) -> Result<KeyHolder> {
        Ok(if row.gone {
            KeyHolder::Gone
        } else {
            KeyHolder::Waiting(String::new())
        })
    }

    async fn insert_jobs(&mut self, _envelopes: Vec<Envelope>) -> Result<()> {
        Ok(())
    }

    async fn replace_job(&mut self, _id: &str, _envelope: &str, _due_us: i64) -> Result<bool> {
        Ok(false)
    }
}

/// Takes the keys of `envelopes` (a broker's messages about to be published) on
/// `table`'s transaction; the duplicates are not to be published.
pub async fn take_broker_keys<T: KeyTable>(
    table: T,
    envelopes: &[Envelope],
    confirm_within: std::time::Duration,
) -> Result<Vec<Duplicate>> {
    let mut s = OnBroker(table);
    let mut dups = Vec::new();
    for env in envelopes {
        if let Some(dup) = publish_unique(&mut s, env, Some(micros(confirm_within))).await? {
            dups.push(dup);
        }
    }
    Ok(dups)
}
