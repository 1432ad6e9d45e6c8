//! Unique keys on RabbitMQ: a broker cannot look up a queued message by key, so the keys
//! live in the SQL control store beside it ([`UniqueKeyStore`]), taken before the
//! publish and read against the jobs' status there.
//!
//! The transport frees a key when its job leaves the key's scope: at its start
//! (`pending`), its ack (or, for `done`, holds it for the period) and its dead letter,
//! each just before the broker is told, so that a process dying in between leaves at
//! worst a second job for the key, never a key held for good.
//!
//! What holds: one job per key among publishes through any process sharing the control
//! store, for every scope, with `done` periods and throttles. What does not: a debounce
//! (`replace`), since a queued message cannot be changed. A key whose publish was never
//! confirmed (the publisher died, or the send failed and was not tried again with the
//! same message) is held until its window ends (the reconnect timeout plus twice the
//! confirm timeout: 90 s by default). A message that expires on the broker frees its key
//! at its expiry, and a key is held a week at most: the broker can drop a message
//! unseen (a quorum queue's delivery limit, a purge, a deleted queue).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use queue_core::{
    Duplicate, Envelope, Error, OnConflict, Reservation, Result, UniqueKeyStore, UniqueScope,
};
use uuid::Uuid;

/// How often publishers delete the key rows that hold nothing any more.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Why RabbitMQ takes no unique keys without a control store.
pub(crate) const UNIQUE_UNSUPPORTED: &str = "unique keys on RabbitMQ live in the SQL control \
    store beside the broker (the job status store of DATABASE_URL, QUEUE_STATUS=on); this \
    transport has none: a broker cannot look up a queued message by key";

/// Why RabbitMQ cannot debounce.
const REPLACE_UNSUPPORTED: &str = "`replace` (debounce) cannot change a message RabbitMQ \
    already queues; use `reject` or `throttle` there, or PostgreSQL, MySQL or SQLite";

/// The keys taken for one publish: the messages not to publish, and those whose keys
/// are to be confirmed (or freed, should the publish fail).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub(crate) duplicates: Vec<Duplicate>,
    pub(crate) keyed: Vec<Envelope>,
}

/// Takes the keys of `envelopes`' messages that have one, removing the duplicates from
/// `envelopes`; refuses the batch, storing nothing, where a key cannot be kept. A key
/// counts as held for `window` even if the publish is never confirmed.
pub(crate) async fn take_keys(
    keys: Option<&Arc<dyn UniqueKeyStore>>,
    envelopes: &mut Vec<Envelope>,
    window: Duration,
) -> Result<Taken> {
    let keyed: Vec<Envelope> = envelopes
        .iter()
        .filter(|e| e.unique.is_some())
        .cloned()
        .collect();
    if keyed.is_empty() {
        return Ok(Taken::default());
    }
    let Some(keys) = keys else {
        return Err(Error::NotSupported(format!(
            "message {}: {UNIQUE_UNSUPPORTED}",
            keyed[0].id
        )));
    };
    if let Some(env) = keyed.iter().find(|e| {
        e.unique
            .as_ref()
            .is_some_and(|u| u.on_conflict == OnConflict::Replace)
    }) {
        return Err(Error::NotSupported(format!(
            "message {}: {REPLACE_UNSUPPORTED}",
            env.id
        )));
    }
    let duplicates = keys.take(&keyed, window).await?;
    let refused: HashSet<Uuid> = duplicates.iter().map(|d| d.id).collect();
    envelopes.retain(|e| !refused.contains(&e.id));
    Ok(Taken {
        duplicates,
        keyed: keyed
            .into_iter()
            .filter(|e| !refused.contains(&e.id))
            .collect(),
    })
}

/// After a confirmed publish: the taken keys are held as long as their jobs. A failed
/// publish leaves them as they are: the broker may have confirmed some of the batch, so
/// each key stays held until its window ends, unless the same message is published again
/// (which takes its key afresh). A failure here is logged: a key left unconfirmed is
/// freed when its window ends.
pub(crate) async fn settle(keys: Option<&Arc<dyn UniqueKeyStore>>, taken: &Taken, published: bool) {
    let (Some(keys), false, true) = (keys, taken.keyed.is_empty(), published) else {
        return;
    };
    if let Err(err) = keys.confirmed(&taken.keyed).await {
        tracing::warn!(error = %err, count = taken.keyed.len(), "could not confirm the unique keys of a publish in the control store; they are freed when their confirm window ends");
    }
}

/// Just before `reservations` (held by this process) are acked: each key is held for its
/// `done` period, or freed.
pub(crate) async fn acking(keys: &dyn UniqueKeyStore, reservations: &[&Reservation]) -> Result<()> {
    let (held, free): (Vec<&Reservation>, Vec<&Reservation>) = reservations
        .iter()
        .filter(|r| r.envelope.unique.is_some())
        .partition(|r| {
            r.envelope
                .unique
                .as_ref()
                .is_some_and(|u| u.period().is_some())
        });
    let held: Vec<Reservation> = held.into_iter().cloned().collect();
    let holds = queue_core::sql::unique::holds_after_ack(&held);
    if !holds.is_empty() {
        keys.hold(&holds).await?;
    }
    free_keys(keys, free.into_iter()).await
}

/// Frees the keys of `reservations`' jobs that have one.
pub(crate) async fn free_keys<'a>(
    keys: &dyn UniqueKeyStore,
    reservations: impl Iterator<Item = &'a Reservation>,
) -> Result<()> {
    let envelopes: Vec<Envelope> = reservations
        .filter(|r| r.envelope.unique.is_some())
        .map(|r| r.envelope.clone())
        .collect();
    if envelopes.is_empty() {
        return Ok(());
    }
    keys.free(&envelopes).await
}

/// Whether `r`'s key is held only while its job waits (freed at its start).
pub(crate) fn pending_scope(r: &Reservation) -> bool {
    r.envelope
        .unique
        .as_ref()
        .is_some_and(|u| u.scope == UniqueScope::Pending)
}
