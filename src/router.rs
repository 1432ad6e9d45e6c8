//! The migration router: one [`Transport`] over the configured backend and the other one,
//! for a canary rollout (`QUEUE_CANARY_PERCENT`) and for draining the backend a flip of
//! `QUEUE_BACKEND` leaves (`QUEUE_DRAIN`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use queue_core::{
    AckReport, BackendKind, CancellationToken, Capabilities, Claim, DeadLetter, DeadLetters,
    DeadSelection, Envelope, Error, GiveBack, HeldSelection, Holding, Holdings, Published,
    QueueName, QueueStats, Reservation, Result, Transport,
};
use tokio::sync::Notify;
use uuid::Uuid;

/// Which side a reservation came from, in its receipt's origin.
const PRIMARY: u8 = 0;
const OTHER: u8 = 1;

/// Publishes to the configured backend, except a canary share (by a hash of the message
/// id, so one id always lands on the same side) that goes to the other; reserves from
/// both, alternating which is asked first; and settles each message on the backend it
/// came from.
pub struct Router {
    primary: Arc<dyn Transport>,
    primary_kind: BackendKind,
    other: Arc<dyn Transport>,
    canary_percent: u8,
    /// Per queue, whether the next reserve asks the other side first.
    other_first: Mutex<HashMap<String, bool>>,
    wakers: Mutex<HashMap<String, Arc<Notify>>>,
    /// Stops the wake-up forwarding tasks when the router goes.
    stop: CancellationToken,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("primary", &self.primary_kind)
            .field("canary_percent", &self.canary_percent)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router over `primary` (the backend `QUEUE_BACKEND` names, of kind
    /// `primary_kind`) and `other`, sending `canary_percent` of publishes to `other`.
    pub fn new(
        primary: Arc<dyn Transport>,
        primary_kind: BackendKind,
        other: Arc<dyn Transport>,
        canary_percent: u8,
    ) -> Self {
        Router {
            primary,
            primary_kind,
            other,
            canary_percent: canary_percent.min(100),
            other_first: Mutex::default(),
            wakers: Mutex::default(),
            stop: CancellationToken::new(),
        }
    }

    /// The backend `QUEUE_BACKEND` names and the other one, with their kinds.
    pub fn sides(&self) -> [(BackendKind, &Arc<dyn Transport>); 2] {
        [
            (self.primary_kind, &self.primary),
            (self.primary_kind.other(), &self.other),
        ]
    }

    fn side(&self, r: &Reservation) -> &Arc<dyn Transport> {
        if r.receipt.origin() == OTHER {
            &self.other
        } else {
            &self.primary
        }
    }

    /// Splits `reservations` by the side they came from.
    fn split(&self, reservations: &[Reservation]) -> [Vec<Reservation>; 2] {
        let mut sides = [Vec::new(), Vec::new()];
        for r in reservations {
            let i = usize::from(r.receipt.origin() == OTHER);
            sides[i].push(r.clone());
        }
        sides
    }

    /// Claims up to `claim.max` of `queue` from both sides, the side asked first
    /// alternating per queue so that neither starves. A side that fails is skipped (and
    /// logged) as long as the other answers: what one side handed out is never dropped
    /// because the other failed.
    async fn claim_both(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>> {
        let max = claim.max;
        let other_first = {
            let mut turns = self.other_first.lock().unwrap_or_else(|e| e.into_inner());
            let turn = turns.entry(queue.as_str().to_owned()).or_default();
            *turn = !*turn;
            !*turn
        };
        let order = if other_first {
            [(&self.other, OTHER), (&self.primary, PRIMARY)]
        } else {
            [(&self.primary, PRIMARY), (&self.other, OTHER)]
        };
        let mut out = Vec::new();
        let mut failed = None;
        for (t, origin) in order {
            if out.len() >= max {
                break;
            }
            let rest = claim.with_max(max - out.len());
            match t.claim(queue, rest).await {
                Ok(got) => out.extend(got.into_iter().map(|r| marked(r, origin))),
                Err(err) => {
                    tracing::warn!(backend = t.name(), error = %err, "router: a backend's claim failed; serving the other");
                    failed = Some(err);
                }
            }
        }
        match failed {
            Some(err) if out.is_empty() => Err(err),
            _ => Ok(out),
        }
    }
}

impl Router {
    /// Before a command over every queue acts on one side: whether both sides can name
    /// their queues (RabbitMQ cannot, in a process that used none).
    async fn both_can_list(&self, queue: Option<&QueueName>) -> Result<()> {
        if queue.is_none() {
            for side in [&self.primary, &self.other] {
                side.stats(None).await?;
            }
        }
        Ok(())
    }
}

impl Router {
    /// Whether `env` goes to the other side: the canary share, by its id; but a message
    /// with an ordering key or a unique key goes where keys are kept, all of a key's
    /// messages to the same side: the primary when it keeps them (whatever the canary
    /// share, so that changing the share never moves a key while its messages wait on
    /// the other side), else the side that does. Refused when neither does.
    fn to_other(&self, env: &Envelope) -> Result<bool> {
        let (a, b) = (self.primary.capabilities(), self.other.capabilities());
        let (what, kept) = match (&env.ordering_key, &env.unique) {
            (Some(_), _) => ("ordering keys", (a.ordering_keys, b.ordering_keys)),
            (None, Some(_)) => ("unique keys", (a.unique_keys, b.unique_keys)),
            (None, None) => return Ok(canary_side(&env.id, self.canary_percent)),
        };
        match kept {
            (true, _) => Ok(false),
            (false, true) => Ok(true),
            (false, false) => Err(Error::NotSupported(format!(
                "message {}: neither {} nor {} keeps {what}",
                env.id,
                self.primary.name(),
                self.other.name()
            ))),
        }
    }
}

fn marked(mut r: Reservation, origin: u8) -> Reservation {
    r.receipt = r.receipt.clone().with_origin(origin);
    r
}

/// Whether `id` goes to the canary side at `percent`: a stable hash of the id (FNV-1a
/// over its bytes), so the same message always lands on the same side.
pub fn canary_side(id: &Uuid, percent: u8) -> bool {
    queue_core::stable_hash::fnv1a(id.as_bytes()) % 100 < u64::from(percent)
}

/// How many more times [`ack_again`] tries a side's acks, backing off from 50 ms.
const ACK_AGAIN_TRIES: u32 = 4;

/// Tries `part`'s acks on `side` again, after `err`; what never commits is reported lost.
async fn ack_again(side: &dyn Transport, part: &[Reservation], mut err: Error) -> AckReport {
    let mut delay = Duration::from_millis(50);
    for _ in 0..ACK_AGAIN_TRIES {
        tracing::warn!(error = %err, side = side.name(), size = part.len(), "acks on one side of the router failed; trying again");
        tokio::time::sleep(delay).await;
        delay *= 2;
        match side.ack_batch(part).await {
            Ok(report) => return report,
            Err(e) => err = e,
        }
    }
    tracing::error!(error = %err, side = side.name(), size = part.len(), "giving up on one side's acks; its messages will be delivered again");
    AckReport {
        acked: Vec::new(),
        lost: part.iter().map(Reservation::id).collect(),
    }
}

/// Adds `from`'s acked and lost ids to `into`'s.
fn merge_reports(into: &mut AckReport, from: AckReport) {
    into.acked.extend(from.acked);
    into.lost.extend(from.lost);
}

// A forwarding impl: every method is written out, so that no default ever stands in
// for a side's own.
#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Transport for Router {
    fn name(&self) -> &'static str {
        "router"
    }

    fn capabilities(&self) -> Capabilities {
        // What both sides promise.
        let (a, b) = (self.primary.capabilities(), self.other.capabilities());
        let mut caps = a;
        // Messages are split between two stores, and reserves alternate between them: no
        // order holds across the two.
        caps.exact_fifo = false;
        caps.priorities = false;
        caps.exact_delays = a.exact_delays && b.exact_delays;
        caps.lease_extension = a.lease_extension && b.lease_extension;
        caps.lease_expiry = a.lease_expiry && b.lease_expiry;
        caps.exact_claims = a.exact_claims && b.exact_claims;
        caps.idempotent_publish = a.idempotent_publish && b.idempotent_publish;
        caps.expiry = a.expiry && b.expiry;
        caps.table_isolation = a.table_isolation && b.table_isolation;
        caps.transactional_publish = a.transactional_publish && b.transactional_publish;
        caps.wake_signal = a.wake_signal || b.wake_signal;
        caps.delayed_stats = a.delayed_stats && b.delayed_stats;
        caps.charges_only_started = a.charges_only_started && b.charges_only_started;
        caps.start_marks_in_status = a.start_marks_in_status || b.start_marks_in_status;
        // Each side keeps its own upkeep, called through the router.
        caps.upkeep = a.upkeep || b.upkeep;
        caps.label_claims = a.label_claims && b.label_claims;
        // A key's messages all go to one side that keeps their order (see `to_other`).
        caps.ordering_keys = a.ordering_keys || b.ordering_keys;
        // Likewise a unique key's jobs: one side holds the key.
        caps.unique_keys = a.unique_keys || b.unique_keys;
        // Limits live in the status store, which both sides share.
        caps.limits = a.limits && b.limits;
        // The jobs are in two places and the limits' store beside at most one of them:
        // a denied job is put back to wait rather than parked.
        caps.limit_parking = false;
        // A run is fenced by a lease token on one side and a start mark on the other.
        caps.checkpoints = false;
        caps.unique_replace = if a.unique_keys {
            a.unique_replace
        } else {
            b.unique_replace
        };
        // Each side lists what it holds; one that cannot adds nothing.
        caps.holders = a.holders || b.holders;
        caps.max_payload_bytes = a.max_payload_bytes.min(b.max_payload_bytes);
        caps
    }

    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = wakers.get(queue.as_str()) {
            return Some(n.clone());
        }
        let ours = Arc::new(Notify::new());
        // Either side's signal wakes the worker; it then reserves from both.
        for side in [&self.primary, &self.other] {
            if let Some(theirs) = side.wake_signal(queue) {
                let ours = Arc::downgrade(&ours);
                let stop = self.stop.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = theirs.notified() => {}
                        }
                        match ours.upgrade() {
                            Some(n) => n.notify_waiters(),
                            None => return,
                        }
                    }
                });
            }
        }
        wakers.insert(queue.as_str().to_owned(), ours.clone());
        Some(ours)
    }

    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        // Nothing is stored unless every envelope is valid and fits both sides. (Should
        // the second side then fail, the first side's part is stored and a retry
        // publishes it again: at least once.)
        let limit = self.capabilities().max_payload_bytes;
        let mut envelopes = envelopes;
        for env in &mut envelopes {
            env.normalize_for_store()?;
            env.check_size(limit)?;
        }
        let mut canary = Vec::new();
        let mut rest = Vec::new();
        for env in envelopes {
            if self.to_other(&env)? {
                canary.push(env);
            } else {
                rest.push(env);
            }
        }
        let mut published = Published::all_stored();
        if !rest.is_empty() {
            published.merge(self.primary.publish_batch(rest).await?);
        }
        if !canary.is_empty() {
            published.merge(self.other.publish_batch(canary).await?);
        }
        Ok(published)
    }

    async fn claim(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>> {
        self.claim_both(queue, claim).await
    }

    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        let mut report = AckReport::default();
        for (t, part) in [&self.primary, &self.other]
            .into_iter()
            .zip(self.split(reservations))
        {
            if !part.is_empty() {
                merge_reports(&mut report, t.start_batch(&part).await?);
            }
        }
        Ok(report)
    }

    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        // Each side is acked whatever the other does: one side's outage must not hold
        // back acks the other can commit.
        let mut report = AckReport::default();
        let mut failed = Vec::new();
        let mut committed = false;
        for (t, part) in [&self.primary, &self.other]
            .into_iter()
            .zip(self.split(reservations))
        {
            if part.is_empty() {
                continue;
            }
            match t.ack_batch(&part).await {
                Ok(r) => {
                    merge_reports(&mut report, r);
                    committed = true;
                }
                Err(err) => failed.push((t, part, err)),
            }
        }
        if !committed {
            // Nothing committed: the caller may try the whole batch again.
            return match failed.into_iter().next() {
                Some((_, _, err)) => Err(err),
                None => Ok(report),
            };
        }
        // One side committed, so the batch cannot be tried again whole (its acks would
        // come back as lost leases): the side that failed is tried again here, and what
        // it still cannot ack is reported lost, to come back as after a lost lease.
        for (t, part, err) in failed {
            merge_reports(&mut report, ack_again(t.as_ref(), &part, err).await);
        }
        Ok(report)
    }

    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()> {
        self.side(reservation).give_back(reservation, how).await
    }

    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        self.side(reservation)
            .dead_letter(reservation, reason, error)
            .await
    }

    async fn extend(&self, reservation: &Reservation, lease: Duration) -> Result<()> {
        self.side(reservation).extend(reservation, lease).await
    }

    /// Both sides' counts, added up per queue (the CLI's `stats` shows them apart).
    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
        for side in [&self.primary, &self.other] {
            for s in side.stats(queue).await? {
                let sum = by_queue
                    .entry(s.queue.clone())
                    .or_insert_with(|| QueueStats::new(s.queue.clone()));
                sum.ready += s.ready;
                sum.delayed += s.delayed;
                sum.reserved += s.reserved;
                sum.dead += s.dead;
                sum.oldest_ready_age = sum.oldest_ready_age.max(s.oldest_ready_age);
            }
        }
        Ok(by_queue.into_values().collect())
    }

    /// Both sides' upkeep: one failing does not keep the other from its own. Each
    /// failure is logged with its side; the first is returned.
    async fn maintain(&self) -> Result<()> {
        let (a, b) = tokio::join!(self.primary.maintain(), self.other.maintain());
        let mut first = None;
        for (which, side, done) in [("primary", &self.primary, a), ("other", &self.other, b)] {
            if let Err(err) = done {
                tracing::warn!(side = which, backend = side.name(), error = %err, "router: a backend's upkeep failed");
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[async_trait]
impl Holdings for Router {
    /// What both sides hold, the primary's first; a side that cannot list its holdings
    /// (RabbitMQ) adds nothing, and only both failing is an error.
    async fn held(&self, which: HeldSelection<'_>, limit: usize) -> Result<Vec<Holding>> {
        let (mut out, mut answered, mut failed) = (Vec::new(), false, None);
        for side in [&self.primary, &self.other] {
            match side.held(which, limit.saturating_sub(out.len())).await {
                Ok(held) => {
                    answered = true;
                    out.extend(held);
                }
                Err(Error::NotSupported(why)) => failed = failed.or(Some(Error::NotSupported(why))),
                Err(err) => {
                    tracing::warn!(backend = side.name(), error = %err, "router: a backend's holdings are unavailable");
                    failed = Some(err);
                }
            }
        }
        match failed {
            Some(err) if !answered => Err(err),
            _ => Ok(out),
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl DeadLetters for Router {
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut all = self.primary.dead_list(queue, limit).await?;
        all.extend(self.other.dead_list(queue, limit).await?);
        all.sort_by_key(|d| d.dead_at);
        all.truncate(limit);
        Ok(all)
    }

    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, true).await
    }

    async fn dead_purge(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, false).await
    }

    /// Into the side `QUEUE_BACKEND` names, where new work goes.
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        self.primary.dead_insert(letters).await
    }
}

impl Router {
    /// Replays (`replay`) or purges the selected dead letters on both sides; a letter
    /// selected by id is missing only when neither side has it.
    async fn settle_dead(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
        replay: bool,
    ) -> Result<u64> {
        self.both_can_list(queue).await?;
        let (mut n, mut missing) = (0, 0);
        for side in [&self.primary, &self.other] {
            let settled = if replay {
                side.dead_replay(queue, selection).await
            } else {
                side.dead_purge(queue, selection).await
            };
            match settled {
                Ok(k) => n += k,
                Err(Error::NotFound { .. }) => missing += 1,
                Err(err) => return Err(err),
            }
        }
        match selection {
            DeadSelection::Id(id) if missing == 2 => Err(Error::NotFound {
                what: "dead letter",
                id: id.clone(),
            }),
            _ => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canary_share_is_stable_and_close_to_its_percent() {
        let ids: Vec<Uuid> = (0..20_000).map(|_| Uuid::now_v7()).collect();
        for percent in [0u8, 10, 50, 100] {
            let n = ids.iter().filter(|id| canary_side(id, percent)).count();
            let share = 100.0 * n as f64 / ids.len() as f64;
            assert!(
                (share - f64::from(percent)).abs() < 1.5,
                "{percent}%: {share:.2}%"
            );
        }
        assert!(ids
            .iter()
            .all(|id| canary_side(id, 10) == canary_side(id, 10)));
    }
}
