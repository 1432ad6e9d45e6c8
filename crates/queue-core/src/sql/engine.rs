//! The one implementation of [`Transport`] and [`DeadLetters`] for every SQL backend:
//! the logic of the contract over a backend's primitives ([`SqlBackend`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use super::backend::{EngineState, LeaseOp, PairOp, SqlBackend};
use super::claim::reserve_rows;
use super::fence::{fenced, replay_refused};
use super::store::sql_capabilities;
use super::unique::holds_after_ack;
use super::values::{attempts_u32, row_seq, selection_parts};
use crate::capabilities::Capabilities;
use crate::dead_letters::{DeadLetter, DeadLetters, DeadSelection};
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::holdings::{HeldSelection, Holding, Holdings};
use crate::names::QueueName;
use crate::published::Published;
use crate::reservation::{AckReport, Reservation};
use crate::time_units::{micros, time_from_micros};
use crate::transport::{Claim, GiveBack, QueueStats, Transport};

/// How often the upkeep (a worker's, or else a claim's) may sweep expired messages to the
/// dead-letter store.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How often the upkeep looks for ordering keys whose head left without handing them on,
/// besides right after a sweep that moved expired messages (the usual cause). The look
/// reads every parked message, so it is a backstop (a quarantined head, a mover that
/// died), not a pace.
const KEY_REPAIR_EVERY: Duration = Duration::from_secs(60);

/// How soon after the last look an expiry sweep that moved messages looks again: a
/// steady trickle of expiries (of messages with keys or without) must not make every
/// sweep read every parked message.
const KEY_REPAIR_AFTER_EXPIRY: Duration = Duration::from_secs(5);

/// How long after a worker's last call for the upkeep ([`Transport::maintain`]) claims
/// leave it to the workers: a few of their one-second calls.
const UPKEEP_HANDED_OVER: Duration = Duration::from_secs(5);

/// How long one upkeep call keeps it from claims and from other calls while it runs (a
/// key repair over a large table, lock waits): past that, a call is taken for stuck.
const UPKEEP_BUSY_AT_MOST: Duration = Duration::from_secs(120);

#[async_trait]
impl<B: SqlBackend> Transport for B {
    fn name(&self) -> &'static str {
        SqlBackend::name(self)
    }

    fn capabilities(&self) -> Capabilities {
        sql_capabilities(self.max_payload_bytes())
    }

    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        self.watch_publishes();
        Some(self.engine().wakers.get(queue.as_str()))
    }

    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        if envelopes.is_empty() {
            return Ok(Published::all_stored());
        }
        let mut queues: Vec<QueueName> = Vec::new();
        for env in &envelopes {
            if queues.last() != Some(&env.queue) {
                queues.push(env.queue.clone());
            }
        }
        let published = if envelopes.iter().any(|e| e.unique.is_some()) {
            let mut envelopes = envelopes;
            for env in &mut envelopes {
                env.normalize_for_store()?;
                env.check_size(self.max_payload_bytes())?;
            }
            self.insert_unique(envelopes).await?
        } else {
            self.insert(envelopes).await?;
            Published::all_stored()
        };
        // Workers of this transport need not wait for another process's signal.
        self.engine()
            .wakers
            .wake_each(queues.iter().map(QueueName::as_str));
        Ok(published)
    }

    async fn claim(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>> {
        if claim.max == 0 {
            return Ok(Vec::new());
        }
        // Without a worker's upkeep (a process that only claims), the claim does it.
        if !upkeep_handed_over(self) {
            if let Err(err) = sweep(self).await {
                tracing::warn!(error = %err, "moving expired messages to the dead-letter store failed; retrying later");
            }
        }
        let rows = reserve_rows(self, queue, claim, self.lease()).await?;
        self.engine()
            .wakers
            .claimed(queue.as_str(), !rows.is_empty());
        Ok(rows)
    }

    async fn maintain(&self) -> Result<()> {
        let Some(_busy) = UpkeepCall::start(self.engine()) else {
            // Another call (another worker on this transport) is doing it.
            return Ok(());
        };
        sweep(self).await
    }

    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        if reservations.is_empty() {
            return Ok(AckReport::default());
        }
        self.by_pairs(PairOp::Start(micros(self.lease())), reservations)
            .await
    }

    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        if reservations.is_empty() {
            return Ok(AckReport::default());
        }
        // Before the ack: a key held once the job is gone could not be told from a
        // key whose job was dead-lettered.
        let holds = holds_after_ack(reservations);
        if !holds.is_empty() {
            self.hold_keys(&holds).await?;
        }
        self.by_pairs(PairOp::Ack, reservations).await
    }

    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()> {
        match how {
            GiveBack::Retry { delay, error } => {
                let error = error.map(crate::text::error_text);
                let op = LeaseOp::Release(micros(delay), error.as_deref());
                fenced(self.on_lease(op, reservation).await?, reservation)?;
                if delay.is_zero() {
                    let queue = reservation.envelope.queue.as_str();
                    self.engine().wakers.wake(queue);
                }
                Ok(())
            }
            GiveBack::Snooze { delay } => {
                let touched = self
                    .on_lease(LeaseOp::Snooze(micros(delay)), reservation)
                    .await?;
                fenced(touched, reservation)?;
                if delay.is_zero() {
                    self.engine()
                        .wakers
                        .wake(reservation.envelope.queue.as_str());
                }
                Ok(())
            }
            GiveBack::Unstarted => {
                let touched = self.on_lease(LeaseOp::Abandon, reservation).await?;
                fenced(touched, reservation)
            }
        }
    }

    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        // The receipt's tag is the row's seq; a replayed message gets a new row.
        let moved = self
            .move_to_dead(
                row_seq(reservation),
                reservation.token(),
                reason,
                error,
                reservation
                    .envelope
                    .ordering_key
                    .as_deref()
                    .map(|k| (reservation.envelope.queue.as_str(), k)),
            )
            .await?;
        if moved {
            tracing::info!(message_id = %reservation.id(), reason, "dead-lettered");
        }
        fenced(moved, reservation)
    }

    async fn extend(&self, reservation: &Reservation, lease: Duration) -> Result<()> {
        let touched = self
            .on_lease(LeaseOp::Extend(micros(lease)), reservation)
            .await?;
        fenced(touched, reservation)
    }

    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        let (waiting, dead) = self.stats_rows(queue).await?;
        let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
        for row in waiting {
            let s = by_queue
                .entry(row.queue.clone())
                .or_insert_with(|| QueueStats::new(row.queue));
            s.ready = row.ready;
            s.delayed = row.delayed;
            s.reserved = row.reserved;
            s.oldest_ready_age = row
                .oldest_ready_us
                .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        }
        for (name, n) in dead {
            by_queue
                .entry(name.clone())
                .or_insert_with(|| QueueStats::new(name))
                .dead = n;
        }
        Ok(by_queue.into_values().collect())
    }
}

/// Whether a worker called for the upkeep lately, or a call is still doing it, so that
/// claims leave it to the workers.
fn upkeep_handed_over<B: SqlBackend + ?Sized>(backend: &B) -> bool {
    let upkeep = backend
        .engine()
        .upkeep
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    upkeep
        .called
        .is_some_and(|at| at.elapsed() < UPKEEP_HANDED_OVER)
        || upkeep
            .busy_since
            .is_some_and(|at| at.elapsed() < UPKEEP_BUSY_AT_MOST)
}

/// One worker's call doing the upkeep, since when; it ends when dropped, also when the
/// call is.
struct UpkeepCall<'a>(&'a EngineState, Instant);

impl<'a> UpkeepCall<'a> {
    /// Records the call, and starts the upkeep unless another call is doing it.
    fn start(engine: &'a EngineState) -> Option<Self> {
        let mut upkeep = engine.upkeep.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        upkeep.called = Some(now);
        if upkeep
            .busy_since
            .is_some_and(|at| at.elapsed() < UPKEEP_BUSY_AT_MOST)
        {
            return None;
        }
        upkeep.busy_since = Some(now);
        Some(UpkeepCall(engine, now))
    }
}

impl Drop for UpkeepCall<'_> {
    fn drop(&mut self) {
        let mut upkeep = self.0.upkeep.lock().unwrap_or_else(|e| e.into_inner());
        // A call taken for stuck may end after another took over: that one's stays.
        if upkeep.busy_since == Some(self.1) {
            upkeep.busy_since = None;
        }
    }
}

/// Moves unleased expired rows to the dead-letter store, at most once per second.
async fn sweep<B: SqlBackend + ?Sized>(backend: &B) -> Result<()> {
    {
        let mut last = backend
            .engine()
            .last_sweep
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
            return Ok(());
        }
        *last = Some(Instant::now());
    }
    let moved = backend.sweep_expired().await?;
    if moved > 0 {
        tracing::info!(
            count = moved,
            "expired messages moved to the dead-letter store"
        );
    }
    let repair = {
        let mut state = backend
            .engine()
            .key_repair
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (last, owed) = &mut *state;
        *owed |= moved > 0;
        let due = last
            .map(|t| t.elapsed())
            .is_none_or(|t| t >= KEY_REPAIR_EVERY || (*owed && t >= KEY_REPAIR_AFTER_EXPIRY));
        if due {
            *last = Some(Instant::now());
            *owed = false;
        }
        due
    };
    if repair {
        // Rides on the key repair's pace: rows of unique keys whose jobs are gone.
        match backend.prune_keys().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(count = n, "unique keys that hold nothing were deleted"),
            Err(err) => {
                tracing::warn!(error = %err, "deleting unique keys that hold nothing failed; retrying later")
            }
        }
        let handed = backend.repair_keys().await?;
        if handed > 0 {
            // Idle workers of those keys' queues claim what was handed on at once,
            // not at their next poll.
            backend.engine().wakers.wake_all();
            tracing::info!(
                count = handed,
                "ordering keys whose head had left were handed to their next message"
            );
        }
    }
    Ok(())
}

#[async_trait]
impl<B: SqlBackend> DeadLetters for B {
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let rows = self.dead_rows(queue, limit).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut d = DeadLetter::new(
                row.id,
                row.queue,
                row.reason,
                time_from_micros(row.dead_at_us),
            );
            d.kind = row.kind;
            d.attempts = attempts_u32(row.attempts);
            d.last_error = row.last_error;
            match Envelope::from_json(&row.body) {
                Ok(mut env) => {
                    // The columns carry the delivery state; the JSON the message as
                    // published.
                    env.attempts = d.attempts;
                    env.last_error.clone_from(&d.last_error);
                    d.ordering_key.clone_from(&env.ordering_key);
                    d.envelope = Some(env);
                }
                Err(_) => d.raw = Some(row.body),
            }
            out.push(d);
        }
        Ok(out)
    }

    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        let (id, age) = selection_parts(selection)?;
        let replayed = self.replay_dead(queue, id.as_deref(), age).await?;
        if replayed.count == 0 {
            if let DeadSelection::Id(id) = selection {
                return Err(replay_refused(id, self.dead_exists(id).await?));
            }
        }
        let wakers = &self.engine().wakers;
        match &replayed.queues {
            Some(queues) => queues.iter().for_each(|q| wakers.wake(q)),
            None if replayed.count > 0 => wakers.wake_all(),
            None => {}
        }
        tracing::info!(count = replayed.count, "dead letters replayed");
        Ok(replayed.count)
    }

    async fn dead_purge(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        let (id, age) = selection_parts(selection)?;
        let purged = self.purge_dead(queue, id.as_deref(), age).await?;
        if purged == 0 {
            if let DeadSelection::Id(id) = selection {
                return Err(Error::NotFound {
                    what: "dead letter",
                    id: id.clone(),
                });
            }
        }
        Ok(purged)
    }

    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        if letters.is_empty() {
            return Ok(0);
        }
        self.insert_dead(letters).await?;
        Ok(letters.len() as u64)
    }
}

#[async_trait]
impl<B: SqlBackend> Holdings for B {
    async fn held(&self, which: HeldSelection<'_>, limit: usize) -> Result<Vec<Holding>> {
        let (queue, id) = match which {
            HeldSelection::Queue(queue) => (queue, None),
            HeldSelection::Id(id) => (None, Some(id)),
        };
        let rows = self.held_rows(queue, id, limit).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let mut h = Holding::new(row.id, row.queue, time_from_micros(row.lease_until_us));
                h.kind = row.kind;
                h.holder = row.holder;
                h.claimed_at = row.claimed_at_us.map(time_from_micros);
                h.started = row.started;
                h.attempts = attempts_u32(row.attempts);
                h
            })
            .collect())
    }
}
