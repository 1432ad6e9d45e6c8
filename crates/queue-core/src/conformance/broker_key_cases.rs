//! The unique keys a SQL store keeps for a broker (RabbitMQ's, when the store is its
//! control store), asked of the store itself: every SQL backend keeps them, whichever
//! one a RabbitMQ deployment puts beside its broker.

use std::sync::Arc;
use std::time::Duration;

use super::case_support::fresh_queue;
use super::harness::{open_beside, Harness, Store};
use crate::sql::unique::KeyHold;
use crate::{Envelope, QueueName, Result, Unique, UniqueKeyStore};

fn keyed(q: &QueueName, key: &str) -> Envelope {
    Envelope::builder(q.as_str(), "job")
        .unique(Unique::new(key))
        .build()
        .expect("a valid envelope")
}

/// The holder `keys` names for `env`'s key, or `None` when it took the key.
async fn take(
    keys: &dyn UniqueKeyStore,
    env: &Envelope,
    within: Duration,
) -> Result<Option<uuid::Uuid>> {
    let dups = keys.take(std::slice::from_ref(env), within).await?;
    Ok(dups.first().map(|d| d.existing))
}

/// A fresh store (kept for the case's length) and the broker key store beside it, or
/// `None` (said why) where none is kept.
async fn open_keys(
    h: &Arc<dyn Harness>,
) -> Result<Option<(Box<dyn Store>, Arc<dyn UniqueKeyStore>)>> {
    let opened = open_beside(
        h,
        |s, _| s?.unique_keys(),
        "no SQL store beside it keeps a broker's unique keys",
    )
    .await?;
    Ok(opened.map(|(store, _t, _status, keys)| (store, keys)))
}

/// A taken key is held while unconfirmed and after the broker's confirm, until freed; a
/// done hold keeps it for its period; keys are per queue.
pub async fn a_brokers_keys_are_taken_held_and_freed(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, keys)) = open_keys(&h).await? else {
        return Ok(());
    };
    let keys = keys.as_ref();
    let (q, other) = (fresh_queue(), fresh_queue());
    let long = Duration::from_secs(60);

    // Taken, then held while unconfirmed and after the broker's confirm.
    let a = keyed(&q, "a");
    assert_eq!(
        take(keys, &a, long).await?,
        None,
        "a free key was not taken"
    );
    let a2 = keyed(&q, "a");
    assert_eq!(
        take(keys, &a2, long).await?,
        Some(a.id),
        "an unconfirmed key was taken twice"
    );
    assert_eq!(
        take(keys, &keyed(&other, "a"), long).await?,
        None,
        "keys are per queue"
    );
    keys.confirmed(std::slice::from_ref(&a)).await?;
    assert_eq!(
        take(keys, &a2, long).await?,
        Some(a.id),
        "a confirmed key was taken twice"
    );

    // Freed (the job left the key's scope): taken by the next.
    keys.free(std::slice::from_ref(&a)).await?;
    assert_eq!(
        take(keys, &a2, long).await?,
        None,
        "a freed key was not taken again"
    );
    keys.confirmed(std::slice::from_ref(&a2)).await?;

    // A done hold keeps the key for its period, past the job.
    keys.hold(&[KeyHold {
        queue: q.as_str().to_owned(),
        key: "a".to_owned(),
        id: a2.id.to_string(),
        token: uuid::Uuid::new_v4(),
        period_us: 600_000,
    }])
    .await?;
    keys.free(std::slice::from_ref(&a2)).await?;
    let a3 = keyed(&q, "a");
    assert_eq!(
        take(keys, &a3, long).await?,
        Some(a2.id),
        "a done hold did not hold the key"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        take(keys, &a3, long).await?,
        None,
        "a done hold outlived its period"
    );

    Ok(())
}

/// A publisher that died before the broker's confirm holds its key no longer than the
/// confirm window; pruning leaves every held key held.
pub async fn an_unconfirmed_brokers_key_is_held_for_its_window(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, keys)) = open_keys(&h).await? else {
        return Ok(());
    };
    let keys = keys.as_ref();
    let q = fresh_queue();
    let long = Duration::from_secs(60);
    let a = keyed(&q, "a");
    assert_eq!(take(keys, &a, long).await?, None);
    keys.confirmed(std::slice::from_ref(&a)).await?;
    // A publisher that died before the broker's confirm holds its key no longer than
    // the confirm window.
    let b = keyed(&q, "b");
    assert_eq!(take(keys, &b, Duration::from_millis(300)).await?, None);
    let b2 = keyed(&q, "b");
    assert_eq!(
        take(keys, &b2, long).await?,
        Some(b.id),
        "the confirm window did not hold the key"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        take(keys, &b2, long).await?,
        None,
        "an unconfirmed key outlived its window"
    );

    // Pruning leaves every held key held.
    keys.prune(Duration::ZERO).await?;
    assert_eq!(
        take(keys, &keyed(&q, "a"), long).await?,
        Some(a.id),
        "pruning freed a held key"
    );
    assert_eq!(
        take(keys, &keyed(&q, "b"), long).await?,
        Some(b2.id),
        "pruning freed a held key"
    );
    Ok(())
}
