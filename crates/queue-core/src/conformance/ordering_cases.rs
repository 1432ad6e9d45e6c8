//! Cases of ordering keys: one message of a key at a time, in publish order, a retry or
//! a lapsed lease holding the key, a dead letter or an expiry handing it on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::case_support::{applies, fresh_queue, message, reserve_within, with_lease};
use super::harness::{Harness, Store};
use crate::{DeadSelection, Envelope, QueueName, Reservation, Result, Transport, TransportExt};

fn keyed(q: &QueueName, kind: &str, key: &str) -> Envelope {
    Envelope::builder(q.as_str(), kind)
        .ordering_key(key)
        .build()
        .expect("a valid envelope")
}

/// A store with a lease of `lease`, or `None` (having said why) when the backend does
/// not keep ordering keys.
async fn keyed_store(
    h: &Arc<dyn Harness>,
    lease: Duration,
) -> Result<Option<(Box<dyn Store>, Arc<dyn Transport>)>> {
    let store = h.store().await?;
    let t = store.open(with_lease(lease)).await?;
    if !applies(t.as_ref(), "ordering_keys", t.capabilities().ordering_keys) {
        return Ok(None);
    }
    Ok(Some((store, t)))
}

fn kinds(rs: &[Reservation]) -> Vec<&str> {
    let mut k: Vec<&str> = rs.iter().map(|r| r.envelope.kind.as_str()).collect();
    k.sort_unstable();
    k
}

/// Only the oldest message of each key is claimable; the next one becomes claimable when
/// it is acked, a retry keeps the key, and a dead letter hands it on.
pub async fn one_message_per_key_in_publish_order(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(30)).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    t.publish(keyed(&q, "a1", "a")).await?;
    // A batch behind a stored message of its key, and with two of another key.
    t.publish_batch(vec![
        keyed(&q, "a2", "a"),
        keyed(&q, "b1", "b"),
        keyed(&q, "b2", "b"),
        message(&q, "free"),
        keyed(&q, "a3", "a"),
    ])
    .await?;
    let first = t.reserve_batch(&q, 10).await?;
    assert_eq!(
        kinds(&first),
        ["a1", "b1", "free"],
        "one per key, and the unkeyed"
    );
    assert!(
        t.reserve_batch(&q, 10).await?.is_empty(),
        "a key's next was claimable"
    );
    let by_kind = |rs: &[Reservation], kind: &str| {
        rs.iter()
            .find(|r| r.envelope.kind == kind)
            .cloned()
            .expect("claimed")
    };
    t.ack_batch(&first).await?;
    let second = t.reserve_batch(&q, 10).await?;
    assert_eq!(kinds(&second), ["a2", "b2"]);
    assert_eq!(
        by_kind(&second, "a2").envelope.ordering_key.as_deref(),
        Some("a")
    );
    // A retry holds the key: a2 comes again before a3.
    t.release(&by_kind(&second, "a2"), Duration::ZERO, Some("again"))
        .await?;
    t.ack(&by_kind(&second, "b2")).await?;
    let again = t.reserve_batch(&q, 10).await?;
    assert_eq!(kinds(&again), ["a2"], "a retried message lost its key");
    assert_eq!(again[0].envelope.attempts, 1);
    // A dead letter hands the key on, and keeps it for a replay.
    t.dead_letter(&again[0], "max_attempts", Some("gave up"))
        .await?;
    let third = t.reserve_batch(&q, 10).await?;
    assert_eq!(kinds(&third), ["a3"]);
    let dead = t.dead_list(Some(&q), 10).await?;
    let a2 = dead
        .iter()
        .find(|d| d.kind == "a2")
        .expect("a2's dead letter");
    assert_eq!(
        a2.envelope.as_ref().and_then(|e| e.ordering_key.as_deref()),
        Some("a")
    );
    // Replayed while a3 holds the key: it waits behind a3.
    t.dead_replay(Some(&q), &DeadSelection::Id(a2.id.clone()))
        .await?;
    assert!(
        t.reserve_batch(&q, 10).await?.is_empty(),
        "a replay jumped its key"
    );
    t.ack(&third[0]).await?;
    let replayed = t.reserve_batch(&q, 10).await?;
    assert_eq!(kinds(&replayed), ["a2"]);
    t.ack_batch(&replayed).await?;
    Ok(())
}

/// Dead letters of one key replayed together come back one at a time, in the order
/// they died, behind a head published after them.
pub async fn replays_of_a_key_come_back_in_order(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(30)).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    t.publish_batch(vec![keyed(&q, "k1", "a"), keyed(&q, "k2", "a")])
        .await?;
    for kind in ["k1", "k2"] {
        let r = t.reserve(&q).await?.expect("the key's head");
        assert_eq!(r.envelope.kind, kind);
        t.dead_letter(&r, "max_attempts", None).await?;
    }
    t.publish(keyed(&q, "k3", "a")).await?;
    let replayed = t.dead_replay(Some(&q), &DeadSelection::All).await?;
    assert_eq!(replayed, 2);
    for kind in ["k3", "k1", "k2"] {
        let got = t.reserve_batch(&q, 10).await?;
        assert_eq!(kinds(&got), [kind], "the key's messages after a replay");
        t.ack_batch(&got).await?;
    }
    Ok(())
}

/// A delayed head holds its key until it is due, and a lapsed lease keeps the key with
/// the message that held it. (RabbitMQ has neither: a delayed message joins its key's
/// partition when due, and a delivery is held until its channel closes.)
pub async fn delays_and_lapsed_leases_hold_the_key(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(1)).await? else {
        return Ok(());
    };
    if !applies(t.as_ref(), "lease_expiry", t.capabilities().lease_expiry) {
        return Ok(());
    }
    let q = fresh_queue();
    let late = Envelope::builder(q.as_str(), "late")
        .ordering_key("k")
        .delay(Duration::from_millis(800))
        .build()?;
    t.publish_batch(vec![late, keyed(&q, "next", "k")]).await?;
    assert!(
        t.reserve(&q).await?.is_none(),
        "the key's next ran before its delayed head"
    );
    let head = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("the head once due");
    assert_eq!(head.envelope.kind, "late");
    // Its lease lapses: the head comes back, still ahead of the next.
    let back = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("the head again");
    assert_eq!(back.envelope.kind, "late", "a lapsed lease lost the key");
    t.ack(&back).await?;
    let next = t.reserve(&q).await?.expect("the next message");
    assert_eq!(next.envelope.kind, "next");
    t.ack(&next).await
}

/// A head that expires while it waits is dead-lettered and hands its key on.
pub async fn an_expired_head_hands_its_key_on(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(30)).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let brief = Envelope::builder(q.as_str(), "brief")
        .ordering_key("k")
        .delay(Duration::from_millis(300))
        .expires_in(Duration::from_millis(200))
        .build()?;
    t.publish_batch(vec![brief, keyed(&q, "next", "k")]).await?;
    let next = reserve_within(t.as_ref(), &q, Duration::from_secs(15))
        .await?
        .expect("the key handed on after its head expired");
    assert_eq!(next.envelope.kind, "next");
    t.ack(&next).await
}

/// A batch message whose id is already stored (live, or as a dead letter) stores
/// nothing, so it holds no key: the next message of its key in the batch is claimable at
/// once, as it would be published alone after it.
pub async fn a_skipped_message_in_a_batch_holds_no_key(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(30)).await? else {
        return Ok(());
    };
    if !applies(
        t.as_ref(),
        "idempotent_publish",
        t.capabilities().idempotent_publish,
    ) {
        return Ok(());
    }
    let q = fresh_queue();
    // A dead letter whose key was handed on when it died.
    t.publish(keyed(&q, "died", "b")).await?;
    let died = t.reserve(&q).await?.expect("the dead letter to be");
    t.dead_letter(&died, "max_attempts", None).await?;
    // A message stored under another key (a migration router sends every keyed message
    // to the side that keeps keys, so its id is seen there).
    let stored = keyed(&q, "stored", "c");
    t.publish(stored.clone()).await?;
    let mut again = keyed(&q, "stored again", "a");
    again.id = stored.id;
    let mut dead_again = keyed(&q, "died again", "b");
    dead_again.id = died.envelope.id;
    // The live id's batch also has a message behind a live head, which stays parked.
    t.publish_batch(vec![
        again,
        keyed(&q, "a1", "a"),
        keyed(&q, "a2", "a"),
        keyed(&q, "c2", "c"),
    ])
    .await?;
    // A dead id alone in its batch (no live id makes the insert fail and run again).
    t.publish_batch(vec![dead_again, keyed(&q, "b1", "b")])
        .await?;
    let first = t.reserve_batch(&q, 10).await?;
    assert_eq!(
        kinds(&first),
        ["a1", "b1", "stored"],
        "a key's first stored message waited behind one that was never stored"
    );
    t.ack_batch(&first).await?;
    let second = t.reserve_batch(&q, 10).await?;
    assert_eq!(kinds(&second), ["a2", "c2"]);
    t.ack_batch(&second).await?;
    Ok(())
}

/// Eight claimers and a publisher at once, over 12 keys: for every key, handling starts
/// in publish order and never while another message of the key is held.
pub async fn concurrent_claimers_keep_every_key_in_order(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t)) = keyed_store(&h, Duration::from_secs(30)).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    const KEYS: usize = 12;
    const EACH: usize = 15;
    let publisher = {
        let (t, q) = (t.clone(), q.clone());
        tokio::spawn(async move {
            for n in 0..EACH {
                let batch = (0..KEYS)
                    .map(|k| {
                        Envelope::builder(q.as_str(), "step")
                            .ordering_key(format!("key-{k}"))
                            .payload(&serde_json::json!({ "n": n }))
                            .build()
                            .expect("a valid envelope")
                    })
                    .collect();
                t.publish_batch(batch).await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, crate::Error>(())
        })
    };
    type Log = Arc<Mutex<HashMap<String, Vec<(usize, Instant, Instant)>>>>;
    let log: Log = Arc::default();
    let mut claimers = Vec::new();
    for _ in 0..8 {
        let (t, q, log) = (t.clone(), q.clone(), log.clone());
        claimers.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let done: usize = log.lock().expect("log").values().map(Vec::len).sum();
                if done >= KEYS * EACH || Instant::now() > deadline {
                    return Ok::<_, crate::Error>(());
                }
                let batch = t.reserve_batch(&q, 3).await?;
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                for r in &batch {
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let n: serde_json::Value = r.envelope.payload_as()?;
                    let n =
                        usize::try_from(n["n"].as_u64().unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
                    let key = r.envelope.ordering_key.clone().unwrap_or_default();
                    let end = Instant::now();
                    t.ack(r).await?;
                    log.lock()
                        .expect("log")
                        .entry(key)
                        .or_default()
                        .push((n, start, end));
                }
            }
        }));
    }
    publisher.await.expect("the publisher")?;
    for c in claimers {
        c.await.expect("a claimer")?;
    }
    let log = log.lock().expect("log");
    assert_eq!(log.len(), KEYS, "every key handled");
    for (key, runs) in log.iter() {
        let mut by_start = runs.clone();
        by_start.sort_by_key(|(_, start, _)| *start);
        let order: Vec<usize> = by_start.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(
            order,
            (0..EACH).collect::<Vec<_>>(),
            "key {key} out of order"
        );
        for pair in by_start.windows(2) {
            assert!(
                pair[0].2 <= pair[1].1,
                "key {key}: two messages held at once"
            );
        }
    }
    Ok(())
}
