//! The cases: each checks one rule of the contract against a fresh store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

pub use super::bad_data_cases::*;
pub use super::broker_key_cases::*;
use super::case_support::{
    applies, fresh_queue, kinds, message, open, reserve_within, stats_of, with_lease,
};
use super::harness::{Harness, OpenOptions};
pub use super::holder_cases::*;
pub use super::label_cases::*;
pub use super::lease_cases::*;
pub use super::ordering_cases::*;
pub use super::unique_cases::*;
use crate::{reason, DeadSelection, Envelope, Error, Reservation, Result, TransportExt};

/// A message comes back with the exact payload bytes, headers, trace id and metadata.
pub async fn round_trip_preserves_payload_headers_and_trace_id(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let payload = "{\"b\": 1,  \"a\" : [1.50, \"\u{e9}\\u00e9\", 1e3],\n \"z\":null}";
    let env = Envelope::builder(q.as_str(), "send_email")
        .raw_payload(payload)
        .header("tenant", "acme")
        .header("origin", "web-1")
        .trace_id("trace-7f3a")
        .max_attempts(5)
        .expires_in(Duration::from_secs(3600))
        .build()?;
    t.publish(env.clone()).await?;
    let got = t.reserve(&q).await?.expect("the published message");
    assert_eq!(got.id(), env.id);
    assert_eq!(got.envelope.payload.get(), payload, "payload bytes changed");
    assert_eq!(got.envelope.headers, env.headers);
    assert_eq!(got.envelope.trace_id.as_deref(), Some("trace-7f3a"));
    assert_eq!(got.envelope.kind, "send_email");
    assert_eq!(got.envelope.queue, q);
    assert_eq!(got.envelope.max_attempts, Some(5));
    assert_eq!(got.envelope.expires_at, env.expires_at);
    assert_eq!(got.envelope.created_at, env.created_at);
    assert_eq!(got.envelope.attempts, 0);
    assert_eq!(got.envelope.v, 1);
    t.ack(&got).await
}

/// Reserving from an empty queue returns nothing at once instead of waiting.
pub async fn empty_reserve_returns_promptly(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let started = Instant::now();
    assert!(t.reserve(&q).await?.is_none());
    assert!(t.reserve_batch(&q, 50).await?.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an empty reserve waited {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Higher priority first; within a priority, publish order.
pub async fn fifo_within_a_priority_and_higher_priority_first(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let caps = t.capabilities();
    if !caps.exact_fifo {
        return Ok(());
    }
    let q = fresh_queue();
    let mut expected_high = Vec::new();
    let mut expected_normal = Vec::new();
    for i in 0..5 {
        let kind = format!("normal-{i}");
        t.publish(message(&q, &kind)).await?;
        expected_normal.push(kind);
        if caps.priorities && i % 2 == 0 {
            let kind = format!("high-{i}");
            let env = Envelope::builder(q.as_str(), kind.as_str())
                .priority(5)
                .build()?;
            t.publish(env).await?;
            expected_high.push(kind);
        }
    }
    if caps.priorities {
        let low = Envelope::builder(q.as_str(), "low").priority(-3).build()?;
        t.publish(low).await?;
    }
    let mut got = Vec::new();
    while let Some(r) = t.reserve(&q).await? {
        got.push(r.envelope.kind.clone());
        t.ack(&r).await?;
    }
    let mut expected = expected_high;
    expected.extend(expected_normal);
    if caps.priorities {
        expected.push("low".into());
    }
    assert_eq!(got, expected, "one-by-one reserve order");

    // The same order holds within one batch reserve.
    let batch: Vec<Envelope> = (0..20).map(|i| message(&q, &format!("b-{i:02}"))).collect();
    let expected: Vec<String> = batch.iter().map(|e| e.kind.clone()).collect();
    t.publish_batch(batch).await?;
    let got = t.reserve_batch(&q, 50).await?;
    assert_eq!(kinds(&got), expected, "batch reserve order");
    t.ack_batch(&got).await?;
    Ok(())
}

/// A delayed message is not delivered before it is due, and is delivered after.
pub async fn delayed_message_is_invisible_until_due(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let delay = Duration::from_millis(1200);
    let env = Envelope::builder(q.as_str(), "later")
        .delay(delay)
        .build()?;
    let published = Instant::now();
    t.publish(env).await?;
    assert!(t.reserve(&q).await?.is_none(), "delivered before due");
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!(s.ready, 0, "{s:?}");
    if t.capabilities().delayed_stats {
        assert_eq!(s.delayed, 1, "{s:?}");
    }
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("delivered once due");
    assert!(
        published.elapsed() >= delay - Duration::from_millis(100),
        "delivered after {:?}, before the delay of {delay:?}",
        published.elapsed()
    );
    t.ack(&r).await
}

/// A message past its `expires_at` is never delivered; it ends in the dead-letter store
/// with reason `expired`.
pub async fn expired_message_is_never_delivered(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let soon = Envelope::builder(q.as_str(), "soon")
        .expires_in(Duration::from_millis(300))
        .build()?;
    let past = Envelope::builder(q.as_str(), "past")
        .expires_at(chrono::Utc::now() - chrono::TimeDelta::seconds(5))
        .build()?;
    let ids = [soon.id.to_string(), past.id.to_string()];
    t.publish(soon).await?;
    t.publish(past).await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            t.reserve(&q).await?.is_none(),
            "an expired message was delivered"
        );
        let dead = t.dead_list(Some(&q), 10).await?;
        if dead.len() == 2 {
            for d in &dead {
                assert!(ids.contains(&d.id), "unexpected dead letter {}", d.id);
                assert_eq!(d.reason, reason::EXPIRED);
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired messages were not dead-lettered: {dead:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// An acked message is gone, and a second ack of it fails with `LeaseLost`.
pub async fn ack_removes_the_message(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    t.publish(message(&q, "once")).await?;
    let r = t.reserve(&q).await?.expect("a message");
    t.ack(&r).await?;
    assert!(t.reserve(&q).await?.is_none());
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!(
        (s.ready, s.delayed, s.reserved, s.dead),
        (0, 0, 0, 0),
        "{s:?}"
    );
    assert!(matches!(t.ack(&r).await, Err(Error::LeaseLost { .. })));
    Ok(())
}

/// Release makes the message due again after the delay, with one more attempt and the
/// error recorded.
pub async fn release_increments_attempts_and_delays(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    t.publish(message(&q, "flaky")).await?;
    let r = t.reserve(&q).await?.expect("a message");
    assert_eq!(r.envelope.attempts, 0);
    t.release(&r, Duration::from_millis(800), Some("boom: upstream 503"))
        .await?;
    assert!(
        t.reserve(&q).await?.is_none(),
        "released message delivered before its delay"
    );
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!(s.reserved, 0, "{s:?}");
    if t.capabilities().delayed_stats {
        assert_eq!(s.delayed, 1, "{s:?}");
    }
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("redelivered after the delay");
    assert_eq!(r.envelope.attempts, 1);
    assert_eq!(r.envelope.last_error.as_deref(), Some("boom: upstream 503"));
    t.release(&r, Duration::ZERO, None).await?;
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("redelivered at once");
    assert_eq!(r.envelope.attempts, 2);
    t.release(&r, Duration::ZERO, None).await?;
    // A released reservation is spent: it cannot be released or acked again.
    assert!(matches!(
        t.release(&r, Duration::ZERO, None).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(t.ack(&r).await, Err(Error::LeaseLost { .. })));
    Ok(())
}

/// Dead-lettering moves a message atomically; list shows it with reason and error,
/// replay puts it back with attempts reset, purge deletes it.
pub async fn dead_letter_then_list_replay_and_purge(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let m1 = message(&q, "m1");
    let (id1, id2) = (m1.id, Uuid::now_v7());
    t.publish(m1).await?;
    // m1 alone on the queue, so that it is the one reserved on any backend.
    let r = t.reserve(&q).await?.expect("m1");
    assert_eq!(r.id(), id1);
    t.publish(Envelope::builder(q.as_str(), "m2").id(id2).build()?)
        .await?;
    t.publish(message(&q, "m3")).await?;
    t.release(&r, Duration::ZERO, Some("first failure")).await?;
    let mut held = t.reserve_batch(&q, 10).await?;
    assert_eq!(held.len(), 3);
    let at = held.iter().position(|r| r.id() == id1).expect("m1 again");
    let r1 = held.remove(at);
    t.dead_letter(&r1, reason::MAX_ATTEMPTS, Some("bad input: no customer"))
        .await?;
    for r in &held {
        t.dead_letter(r, reason::FAILED, None).await?;
    }
    assert!(
        t.reserve(&q).await?.is_none(),
        "a dead letter was delivered"
    );
    assert!(matches!(t.ack(&r1).await, Err(Error::LeaseLost { .. })));
    // Publishing a dead id again stores nothing new.
    if t.capabilities().idempotent_publish {
        t.publish(Envelope::builder(q.as_str(), "m2 again").id(id2).build()?)
            .await?;
        assert!(
            t.reserve(&q).await?.is_none(),
            "a dead id published again was delivered"
        );
        assert_eq!(stats_of(t.as_ref(), &q).await?.ready, 0);
    }

    let dead = t.dead_list(Some(&q), 10).await?;
    assert_eq!(dead.len(), 3, "{dead:?}");
    let d1 = dead
        .iter()
        .find(|d| d.id == id1.to_string())
        .expect("m1 is dead");
    assert_eq!(d1.reason, reason::MAX_ATTEMPTS);
    assert_eq!(d1.last_error.as_deref(), Some("bad input: no customer"));
    assert_eq!(
        d1.attempts, 2,
        "the released delivery and the dead-lettered one"
    );
    assert_eq!(d1.kind, "m1");
    assert_eq!(d1.envelope.as_ref().map(|e| e.id), Some(id1));
    assert_eq!(stats_of(t.as_ref(), &q).await?.dead, 3);

    assert_eq!(
        t.dead_replay(Some(&q), &DeadSelection::Id(id1.to_string()))
            .await?,
        1
    );
    let again = t.reserve(&q).await?.expect("the replayed message");
    assert_eq!(again.id(), id1);
    assert_eq!(again.envelope.attempts, 0, "replay resets attempts");
    t.ack(&again).await?;

    let missing = t
        .dead_replay(Some(&q), &DeadSelection::Id(Uuid::now_v7().to_string()))
        .await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );

    assert_eq!(
        t.dead_purge(
            Some(&q),
            &DeadSelection::OlderThan(Duration::from_secs(3600))
        )
        .await?,
        0
    );
    assert_eq!(
        t.dead_purge(Some(&q), &DeadSelection::Id(id2.to_string()))
            .await?,
        1
    );
    assert_eq!(t.dead_list(Some(&q), 10).await?.len(), 1);
    assert_eq!(t.dead_purge(Some(&q), &DeadSelection::All).await?, 1);
    assert!(t.dead_list(Some(&q), 10).await?.is_empty());
    assert_eq!(stats_of(t.as_ref(), &q).await?.dead, 0);
    // Once purged, the id is free again.
    t.publish(Envelope::builder(q.as_str(), "m2 anew").id(id2).build()?)
        .await?;
    let anew = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("a purged id published anew");
    assert_eq!((anew.id(), anew.envelope.kind.as_str()), (id2, "m2 anew"));
    t.ack(&anew).await?;
    Ok(())
}

/// Eight workers drain 2,000 messages: every message claimed exactly once, none lost.
pub async fn concurrent_workers_claim_each_message_exactly_once(h: Arc<dyn Harness>) -> Result<()> {
    const TOTAL: usize = 2_000;
    const WORKERS: usize = 8;
    let store = h.store().await?;
    let publisher = store.open(OpenOptions::default()).await?;
    let q = fresh_queue();
    let all: Vec<Envelope> = (0..TOTAL)
        .map(|i| message(&q, &format!("job-{i}")))
        .collect();
    let ids: Vec<Uuid> = all.iter().map(|e| e.id).collect();
    for chunk in all.chunks(500) {
        publisher.publish_batch(chunk.to_vec()).await?;
    }

    let claims: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let t = store.open(OpenOptions::default()).await?;
        let (q, claims, done) = (q.clone(), claims.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while done.load(Ordering::SeqCst) < TOTAL {
                assert!(
                    Instant::now() < deadline,
                    "worker {w} gave up with messages left"
                );
                let batch = t.reserve_batch(&q, 1 + w % 4 * 8).await?;
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                {
                    let mut c = claims.lock().expect("claims lock");
                    for r in &batch {
                        *c.entry(r.id()).or_default() += 1;
                    }
                }
                let report = t.ack_batch(&batch).await?;
                assert!(report.lost.is_empty(), "lost leases: {:?}", report.lost);
                done.fetch_add(report.acked.len(), Ordering::SeqCst);
            }
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await.expect("worker task panicked")?;
    }
    {
        let claims = claims.lock().expect("claims lock");
        let twice: Vec<_> = claims.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "claimed more than once: {twice:?}");
        let missing: Vec<_> = ids.iter().filter(|id| !claims.contains_key(id)).collect();
        assert!(missing.is_empty(), "never claimed: {missing:?}");
        assert_eq!(claims.len(), TOTAL);
    }
    assert!(publisher.reserve(&q).await?.is_none());
    Ok(())
}

/// Messages of one queue are never delivered from another.
pub async fn queues_are_isolated(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let (a, b) = (fresh_queue(), fresh_queue());
    t.publish(message(&a, "for-a")).await?;
    assert!(t.reserve(&b).await?.is_none());
    assert_eq!(stats_of(t.as_ref(), &b).await?.ready, 0);
    let r = t.reserve(&a).await?.expect("a's message");
    assert_eq!(r.envelope.queue, a);
    t.dead_letter(&r, reason::FAILED, None).await?;
    assert!(t.dead_list(Some(&b), 10).await?.is_empty());
    assert_eq!(t.dead_replay(Some(&b), &DeadSelection::All).await?, 0);
    assert_eq!(t.dead_list(Some(&a), 10).await?.len(), 1);
    Ok(())
}

/// Under concurrent publishing, claiming and acking on two queues, no worker ever gets a
/// message of the other queue.
pub async fn queues_stay_isolated_under_concurrent_churn(h: Arc<dyn Harness>) -> Result<()> {
    const PER_QUEUE: usize = 400;
    let store = h.store().await?;
    let queues = [fresh_queue(), fresh_queue()];
    let mut tasks = Vec::new();
    for q in &queues {
        let publisher = store.open(OpenOptions::default()).await?;
        let q2 = q.clone();
        tasks.push(tokio::spawn(async move {
            for chunk in 0..(PER_QUEUE / 20) {
                let batch = (0..20)
                    .map(|i| message(&q2, &format!("m{chunk}-{i}")))
                    .collect();
                publisher.publish_batch(batch).await?;
                tokio::task::yield_now().await;
            }
            Ok::<usize, Error>(0)
        }));
        for _ in 0..2 {
            let t = store.open(OpenOptions::default()).await?;
            let q = q.clone();
            tasks.push(tokio::spawn(async move {
                let mut handled = 0;
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut idle = 0;
                while idle < 40 && Instant::now() < deadline {
                    let batch = t.reserve_batch(&q, 7).await?;
                    if batch.is_empty() {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    idle = 0;
                    for r in &batch {
                        assert_eq!(
                            r.envelope.queue, q,
                            "a worker of {q} got a message of another queue"
                        );
                    }
                    handled += batch.len();
                    t.ack_batch(&batch).await?;
                }
                Ok(handled)
            }));
        }
    }
    let mut handled = 0;
    for task in tasks {
        handled += task.await.expect("a churn task panicked")?;
    }
    assert_eq!(handled, 2 * PER_QUEUE, "every message handled once");
    Ok(())
}

/// Two tables in one database are separate stores.
pub async fn tables_are_isolated(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let one = store
        .open(OpenOptions {
            table: "tenant_one_jobs".into(),
            ..OpenOptions::default()
        })
        .await?;
    if !applies(
        one.as_ref(),
        "table_isolation",
        one.capabilities().table_isolation,
    ) {
        return Ok(());
    }
    let two = store
        .open(OpenOptions {
            table: "tenant_two_jobs".into(),
            ..OpenOptions::default()
        })
        .await?;
    let q = fresh_queue();
    one.publish(message(&q, "tenant-one")).await?;
    assert!(two.reserve(&q).await?.is_none(), "a message crossed tables");
    assert_eq!(stats_of(two.as_ref(), &q).await?.ready, 0);
    let r = one.reserve(&q).await?.expect("tenant one's message");
    one.dead_letter(&r, reason::FAILED, None).await?;
    assert!(
        two.dead_list(Some(&q), 10).await?.is_empty(),
        "a dead letter crossed tables"
    );
    assert_eq!(one.dead_list(Some(&q), 10).await?.len(), 1);
    Ok(())
}

/// Publishing an id that is already stored stores one message.
pub async fn publishing_the_same_id_twice_stores_one_message(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    if !t.capabilities().idempotent_publish {
        return Ok(());
    }
    let q = fresh_queue();
    let env = message(&q, "dup");
    t.publish(env.clone()).await?;
    t.publish(env.clone()).await?;
    let other = message(&q, "other");
    t.publish_batch(vec![env.clone(), other.clone(), other.clone()])
        .await?;
    let got = t.reserve_batch(&q, 10).await?;
    let mut ids: Vec<Uuid> = got.iter().map(Reservation::id).collect();
    ids.sort();
    let mut expected = vec![env.id, other.id];
    expected.sort();
    assert_eq!(ids, expected);
    t.ack_batch(&got).await?;
    Ok(())
}

/// Batch publish stores all, batch reserve returns up to the limit in order.
pub async fn batch_publish_and_batch_reserve(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let batch: Vec<Envelope> = (0..250)
        .map(|i| message(&q, &format!("b-{i:03}")))
        .collect();
    let expected: Vec<String> = batch.iter().map(|e| e.kind.clone()).collect();
    t.publish_batch(batch).await?;
    t.publish_batch(Vec::new()).await?;
    assert_eq!(stats_of(t.as_ref(), &q).await?.ready, 250);
    let first = t.reserve_batch(&q, 100).await?;
    assert_eq!(first.len(), 100);
    let rest = t.reserve_batch(&q, 1_000).await?;
    assert_eq!(rest.len(), 150);
    assert!(t.reserve_batch(&q, 0).await?.is_empty());
    let mut all = first;
    all.extend(rest);
    if t.capabilities().exact_fifo {
        assert_eq!(kinds(&all), expected);
    }
    let report = t.ack_batch(&all).await?;
    assert_eq!(report.acked.len(), 250);
    assert!(report.lost.is_empty());
    assert!(t.ack_batch(&[]).await?.acked.is_empty());
    assert_eq!(stats_of(t.as_ref(), &q).await?.ready, 0);
    Ok(())
}

/// A batch ack acks what it still holds and reports, untouched, what it lost.
pub async fn ack_batch_reports_lost_leases_and_acks_the_rest(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(1))).await?;
    if !applies(t.as_ref(), "lease_expiry", t.capabilities().lease_expiry) {
        return Ok(());
    }
    let q = fresh_queue();
    t.publish_batch((0..3).map(|i| message(&q, &format!("m{i}"))).collect())
        .await?;
    let held = t.reserve_batch(&q, 3).await?;
    assert_eq!(held.len(), 3);
    // Let every lease run out, then take one message over and keep the others idle.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let taken = t.reserve(&q).await?.expect("a reclaimed message");
    let report = t.ack_batch(&held).await?;
    assert_eq!(report.lost, vec![taken.id()]);
    assert_eq!(report.acked.len(), 2);
    t.ack(&taken).await?;
    assert!(t.reserve(&q).await?.is_none());
    Ok(())
}

/// A 1 MiB payload round-trips unchanged.
pub async fn one_mib_payload_round_trips(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let blob: String = (0..1024 * 1024)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let payload = format!("{{\"blob\":\"{blob}\"}}");
    let env = Envelope::builder(q.as_str(), "big")
        .raw_payload(payload.clone())
        .build()?;
    t.publish(env).await?;
    let r = t.reserve(&q).await?.expect("the big message");
    assert!(
        r.envelope.payload.get() == payload,
        "the 1 MiB payload changed"
    );
    t.ack(&r).await
}

/// Stats count ready, delayed, reserved and dead per queue.
pub async fn stats_count_ready_delayed_reserved_and_dead(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    t.publish_batch((0..4).map(|i| message(&q, &format!("r{i}"))).collect())
        .await?;
    t.publish(
        Envelope::builder(q.as_str(), "later")
            .delay(Duration::from_secs(3600))
            .build()?,
    )
    .await?;
    let held = t.reserve_batch(&q, 2).await?;
    t.dead_letter(&held[0], reason::FAILED, Some("x")).await?;
    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!((s.ready, s.reserved, s.dead), (2, 1, 1), "{s:?}");
    if t.capabilities().delayed_stats {
        assert_eq!(s.delayed, 1, "{s:?}");
    }
    let everything = t.stats(None).await?;
    assert!(everything.iter().any(|s| s.queue == q.as_str()));
    Ok(())
}
