//! Cases of unique keys: who holds a key, for how long, and what a second publish does.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::case_support::{applies, fresh_queue, open, reserve_within, stats_of, with_lease};
use super::harness::Harness;
use crate::{Envelope, Error, QueueName, Result, Transport, TransportExt, Unique};

fn keyed(q: &QueueName, kind: &str, unique: Unique) -> Envelope {
    Envelope::builder(q.as_str(), kind)
        .payload(&serde_json::json!({ "kind": kind }))
        .unique(unique)
        .build()
        .expect("a valid envelope")
}

/// Whether unique keys apply to `t`; where they do not, a publish with one is refused
/// and stores nothing.
async fn unique_keys_apply(t: &dyn Transport, q: &QueueName) -> Result<bool> {
    if applies(t, "unique_keys", t.capabilities().unique_keys) {
        return Ok(true);
    }
    let refused = t.publish(keyed(q, "a", Unique::new("k"))).await;
    assert!(
        matches!(refused, Err(Error::NotSupported(_))),
        "a unique key was not refused: {refused:?}"
    );
    assert_eq!(stats_of(t, q).await?.ready, 0, "a refused publish stored");
    Ok(false)
}

/// A second publish of a held key stores nothing and names the job that holds it, in a
/// batch too; keys are per queue; publishing the holder's id again is no conflict.
pub async fn a_held_unique_key_rejects_the_second_publish(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    let first = keyed(&q, "first", Unique::new("account-42"));
    assert!(t.publish(first.clone()).await?.duplicates.is_empty());
    let second = keyed(&q, "second", Unique::new("account-42"));
    let out = t.publish(second.clone()).await?;
    let dup = out
        .duplicate_of(second.id)
        .expect("reported as a duplicate");
    assert_eq!((dup.existing, dup.replaced), (first.id, false));
    // The holder's own id again is no conflict.
    let again = t.publish(first.clone()).await?;
    assert!(again.duplicates.is_empty(), "{again:?}");
    let (a, b) = (
        keyed(&q, "batch-a", Unique::new("k2")),
        keyed(&q, "batch-b", Unique::new("k2")),
    );
    let plain = super::case_support::message(&q, "plain");
    let out = t
        .publish_batch(vec![a.clone(), plain.clone(), b.clone()])
        .await?;
    assert_eq!(out.duplicates.len(), 1, "{out:?}");
    assert_eq!(out.duplicates[0].id, b.id);
    assert_eq!(out.duplicates[0].existing, a.id);
    // A batch keeps its publish order around the messages with unique keys.
    let ordered = fresh_queue();
    let in_order: Vec<Envelope> = (0..4)
        .map(|n| {
            let b = Envelope::builder(ordered.as_str(), format!("n{n}"));
            if n % 2 == 0 {
                b.unique(Unique::new(format!("u{n}"))).build()
            } else {
                b.build()
            }
        })
        .collect::<Result<_>>()?;
    t.publish_batch(in_order).await?;
    let got = t.reserve_batch(&ordered, 10).await?;
    if t.capabilities().exact_fifo {
        let kinds: Vec<_> = got.iter().map(|r| r.envelope.kind.as_str()).collect();
        assert_eq!(kinds, ["n0", "n1", "n2", "n3"], "a batch was reordered");
    }
    t.ack_batch(&got).await?;
    let other_queue = fresh_queue();
    let elsewhere = keyed(&other_queue, "elsewhere", Unique::new("account-42"));
    assert!(t.publish(elsewhere).await?.duplicates.is_empty());

    let got = t.reserve_batch(&q, 10).await?;
    let ids: HashSet<_> = got.iter().map(|r| r.id()).collect();
    assert_eq!(ids, HashSet::from([first.id, a.id, plain.id]));
    // Where publishing an id twice stores it twice (RabbitMQ), the holder's own id again
    // is sent again, as any publish of it would be (a retry of a failed send needs that).
    let copies = if t.capabilities().idempotent_publish {
        3
    } else {
        4
    };
    assert_eq!(got.len(), copies, "one message each");
    t.ack_batch(&got).await?;
    Ok(())
}

/// `pending` frees the key when a worker claims the job; `active` (the default) holds it
/// until the ack or dead letter, and through a retry.
pub async fn unique_scopes_decide_how_long_a_key_is_held(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    let stored = |out: crate::Published| out.duplicates.is_empty();

    let a = keyed(&q, "a", Unique::new("p").while_pending());
    t.publish(a.clone()).await?;
    let held_a = t.reserve(&q).await?.expect("a");
    assert!(
        stored(
            t.publish(keyed(&q, "a2", Unique::new("p").while_pending()))
                .await?
        ),
        "a claimed job kept a `pending` key"
    );
    t.ack(&held_a).await?;
    let a2 = t.reserve(&q).await?.expect("a2");
    t.ack(&a2).await?;

    let c = keyed(&q, "c", Unique::new("act"));
    t.publish(c.clone()).await?;
    let held_c = t.reserve(&q).await?.expect("c");
    let out = t.publish(keyed(&q, "c2", Unique::new("act"))).await?;
    assert_eq!(
        out.duplicates.first().map(|d| d.existing),
        Some(c.id),
        "a running job lost its key"
    );
    t.release(&held_c, Duration::ZERO, Some("retry")).await?;
    let out = t.publish(keyed(&q, "c3", Unique::new("act"))).await?;
    assert_eq!(
        out.duplicates.first().map(|d| d.existing),
        Some(c.id),
        "a retry lost its key"
    );
    let held_c = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("c again");
    t.ack(&held_c).await?;
    assert!(
        stored(t.publish(keyed(&q, "c4", Unique::new("act"))).await?),
        "an ack kept the key"
    );
    let c4 = t.reserve(&q).await?.expect("c4");
    t.dead_letter(&c4, "failed", Some("boom")).await?;
    assert!(
        stored(t.publish(keyed(&q, "c5", Unique::new("act"))).await?),
        "a dead letter kept the key"
    );
    let c5 = t.reserve(&q).await?.expect("c5");
    assert_eq!(c5.envelope.kind, "c5");
    t.ack(&c5).await?;
    Ok(())
}

/// `done` holds a key for its period after the ack; a throttle for its ttl after the
/// publish, whatever became of the job; both let go once the time is up.
pub async fn done_periods_and_throttles_hold_a_key_past_its_job(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    let hold = Duration::from_millis(1200);
    let done = || Unique::new("done").until_done_for(hold);
    let a = keyed(&q, "a", done());
    t.publish(a.clone()).await?;
    let r = t.reserve(&q).await?.expect("a");
    t.ack(&r).await?;
    let acked = Instant::now();
    let out = t.publish(keyed(&q, "a2", done())).await?;
    assert_eq!(
        out.duplicates.first().map(|d| d.existing),
        Some(a.id),
        "the done period did not hold"
    );

    let throttle = || Unique::throttle("thr", hold);
    let b = keyed(&q, "b", throttle());
    t.publish(b.clone()).await?;
    let published = Instant::now();
    let r = t.reserve(&q).await?.expect("b");
    t.ack(&r).await?;
    let out = t.publish(keyed(&q, "b2", throttle())).await?;
    assert_eq!(
        out.duplicates.first().map(|d| d.existing),
        Some(b.id),
        "the throttle did not hold"
    );

    // A done period shorter than a throttle's ttl does not cut the throttle short.
    let both = || {
        Unique::throttle("both", Duration::from_secs(3600)).until_done_for(Duration::from_millis(1))
    };
    t.publish(keyed(&q, "c", both())).await?;
    let r = t.reserve(&q).await?.expect("c");
    t.ack(&r).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        t.publish(keyed(&q, "c2", both())).await?.duplicates.len(),
        1,
        "an ack's done period cut a throttle short"
    );

    tokio::time::sleep((hold + Duration::from_millis(300)).saturating_sub(acked.elapsed())).await;
    assert!(
        t.publish(keyed(&q, "a3", done()))
            .await?
            .duplicates
            .is_empty(),
        "the done period never ended"
    );
    tokio::time::sleep((hold + Duration::from_millis(300)).saturating_sub(published.elapsed()))
        .await;
    assert!(
        t.publish(keyed(&q, "b3", throttle()))
            .await?
            .duplicates
            .is_empty(),
        "the throttle never ended"
    );
    let rest = t.reserve_batch(&q, 10).await?;
    let mut kinds: Vec<_> = rest.iter().map(|r| r.envelope.kind.clone()).collect();
    kinds.sort();
    assert_eq!(kinds, ["a3", "b3"]);
    t.ack_batch(&rest).await?;
    Ok(())
}

/// A stale worker's ack sets no `done` hold: only the lease that holds the job can.
pub async fn a_done_hold_is_set_only_under_the_jobs_lease(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_millis(400))).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    if !applies(t.as_ref(), "lease_expiry", t.capabilities().lease_expiry) {
        return Ok(());
    }
    let rule = || Unique::new("fenced").until_done_for(Duration::from_secs(60));
    t.publish(keyed(&q, "a", rule())).await?;
    let stale = t.reserve(&q).await?.expect("a");
    let fresh = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("reclaimed after the lease lapsed");
    assert!(matches!(t.ack(&stale).await, Err(Error::LeaseLost { .. })));
    t.dead_letter(&fresh, "failed", None).await?;
    assert!(
        t.publish(keyed(&q, "b", rule()))
            .await?
            .duplicates
            .is_empty(),
        "a stale ack held the key for its done period"
    );
    let b = t.reserve(&q).await?.expect("b");
    t.ack(&b).await?;
    Ok(())
}

/// Debounce: a publish while the job waits takes over its payload and due time, never
/// past `max_wait` after the first publish; once a worker has claimed the job, the next
/// publish is a job of its own (the claim wins the race, cleanly).
pub async fn debounce_moves_a_waiting_job_no_later_than_max_wait(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    if !applies(
        t.as_ref(),
        "unique_replace",
        t.capabilities().unique_replace,
    ) {
        let debounce = Envelope::builder(q.as_str(), "sync")
            .unique(Unique::debounce("account-7", Duration::from_secs(1)))
            .build()?;
        let refused = t.publish(debounce).await;
        assert!(
            matches!(refused, Err(Error::NotSupported(_))),
            "a debounce was not refused: {refused:?}"
        );
        return Ok(());
    }
    // A waiting job with an ordering key keeps its place in its key's order: a debounce
    // does not move it.
    let ordered = Envelope::builder(q.as_str(), "ordered")
        .ordering_key("order-1")
        .unique(Unique::new("in-order"))
        .build()?;
    t.publish(ordered.clone()).await?;
    let moved = t
        .publish(
            Envelope::builder(q.as_str(), "ordered")
                .unique(Unique::debounce("in-order", Duration::from_secs(1)))
                .build()?,
        )
        .await?;
    assert_eq!(
        moved.duplicates.first().map(|d| (d.existing, d.replaced)),
        Some((ordered.id, false)),
        "a debounce moved a message with an ordering key"
    );
    let r = t.reserve(&q).await?.expect("the ordered message");
    t.ack(&r).await?;

    let max_wait = Duration::from_millis(1500);
    let event = |n: u32| {
        Envelope::builder(q.as_str(), "sync")
            .payload(&serde_json::json!({ "event": n }))
            .delay(Duration::from_millis(700))
            .unique(Unique::debounce("account-7", max_wait))
            .build()
            .expect("a valid envelope")
    };
    let first = event(0);
    let started = Instant::now();
    t.publish(first.clone()).await?;
    // A burst of events every 150 ms: each pushes the job back 700 ms, so only
    // max_wait brings it due.
    let mut n = 0;
    let mut claimed = None;
    while claimed.is_none() && started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(150)).await;
        n += 1;
        let out = t.publish(event(n)).await?;
        if let Some(dup) = out.duplicates.first() {
            assert_eq!((dup.existing, dup.replaced), (first.id, true));
        }
        claimed = t.reserve(&q).await?;
    }
    let job = claimed.expect("the debounced job came due");
    let late = started.elapsed();
    eprintln!("debounced job came due {late:?} after the first publish (max_wait {max_wait:?}, {n} events)");
    assert_eq!(job.id(), first.id, "the job keeps the first publish's id");
    assert!(
        late >= Duration::from_millis(1000) && late <= max_wait + Duration::from_millis(700),
        "due {late:?} after the first publish, max_wait {max_wait:?}"
    );
    let payload: serde_json::Value = job.envelope.payload_as()?;
    assert!(
        payload["event"].as_u64().unwrap_or(0) >= 1,
        "the payload is a later event's: {payload}"
    );
    // The job is claimed: the next event is a job of its own.
    let next = event(n + 1);
    assert!(t.publish(next.clone()).await?.duplicates.is_empty());
    t.ack(&job).await?;
    let second = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("the next run");
    assert_eq!(second.id(), next.id);
    t.ack(&second).await?;
    Ok(())
}

/// Eight publishers racing 10,000 publishes over 500 keys leave exactly one job per
/// key, and every duplicate names the job that is stored.
pub async fn racing_publishers_leave_one_job_per_key(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let q = fresh_queue();
    let first = store.open(super::harness::OpenOptions::default()).await?;
    if !unique_keys_apply(first.as_ref(), &q).await? {
        return Ok(());
    }
    const PUBLISHERS: usize = 8;
    const PUBLISHES: usize = 10_000;
    const KEYS: usize = 500;
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let t = store.open(super::harness::OpenOptions::default()).await?;
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut stored = Vec::new();
            let mut dups = Vec::new();
            for n in 0..PUBLISHES / PUBLISHERS {
                // Each publisher walks every key from another starting point.
                let key = format!("key-{}", (n + p * 61) % KEYS);
                let env = keyed(&q, "k", Unique::new(key.clone()));
                let out = t.publish(env.clone()).await?;
                match out.duplicates.first() {
                    None => stored.push((key, env.id)),
                    Some(d) => dups.push((key, d.existing)),
                }
            }
            Ok::<_, Error>((stored, dups))
        }));
    }
    let started = Instant::now();
    let (stored, dups) = one_job_per_key(first.as_ref(), &q, tasks).await?;
    eprintln!(
        "{PUBLISHES} racing publishes over {KEYS} keys in {:?}",
        started.elapsed()
    );
    assert_eq!(stored, KEYS, "exactly one stored publish per key");
    assert_eq!(dups, PUBLISHES - KEYS);
    Ok(())
}

/// The publishes of a race that stored their message, and those that were duplicates
/// (of which job), each with its key.
type Outcomes = (Vec<(String, uuid::Uuid)>, Vec<(String, uuid::Uuid)>);

/// Waits for racing publishers and checks that they left one job per key: no key stored
/// twice, every duplicate naming the job stored, and the queue holding exactly those
/// jobs (drained here). How many publishes stored, and how many were duplicates.
async fn one_job_per_key(
    t: &dyn Transport,
    q: &QueueName,
    tasks: Vec<tokio::task::JoinHandle<Result<Outcomes>>>,
) -> Result<(usize, usize)> {
    let (mut stored, mut dups) = (Vec::new(), Vec::new());
    for task in tasks {
        let (s, d) = task.await.expect("a publisher panicked")?;
        stored.extend(s);
        dups.extend(d);
    }
    let by_key: std::collections::HashMap<_, _> = stored.iter().cloned().collect();
    assert_eq!(
        by_key.len(),
        stored.len(),
        "two publishes of one key were stored"
    );
    for (key, existing) in &dups {
        assert_eq!(
            by_key.get(key),
            Some(existing),
            "a duplicate of {key} named another job"
        );
    }
    let s = stats_of(t, q).await?;
    assert_eq!(
        s.ready + s.delayed + s.reserved,
        stored.len() as u64,
        "{s:?}"
    );
    let stored_ids: HashSet<_> = stored.iter().map(|(_, id)| *id).collect();
    let mut seen = HashSet::new();
    loop {
        let got = t.reserve_batch(q, 200).await?;
        if got.is_empty() {
            break;
        }
        for r in &got {
            let key = r.envelope.unique.as_ref().map(|u| u.key.clone());
            assert!(seen.insert(key), "two jobs of one key were stored");
            assert!(stored_ids.contains(&r.id()), "a duplicate was stored");
        }
        t.ack_batch(&got).await?;
    }
    assert_eq!(seen.len(), stored.len(), "a stored publish was lost");
    Ok((stored.len(), dups.len()))
}

/// A batch that mixes fresh keys, a key held before it, a key twice, an id twice, a
/// throttle and messages without keys comes out as the same messages published one at a
/// time would: the same duplicates, naming the same jobs, in the same order; keys whose
/// jobs are gone are taken over by a later batch, and a throttle's hold taken in a batch
/// holds.
pub async fn a_batch_takes_its_keys_as_one_by_one_publishes_would(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    if !unique_keys_apply(t.as_ref(), &q).await? {
        return Ok(());
    }
    let held = keyed(&q, "held", Unique::new("h"));
    assert!(t.publish(held.clone()).await?.duplicates.is_empty());
    let a = keyed(&q, "a", Unique::new("a"));
    let b = keyed(&q, "b", Unique::new("h"));
    let plain = super::case_support::message(&q, "plain");
    let c = keyed(&q, "c", Unique::new("c"));
    let a2 = keyed(&q, "a2", Unique::new("a"));
    let throttled = keyed(&q, "d", Unique::throttle("d", Duration::from_secs(3600)));
    let batch = vec![
        a.clone(),
        b.clone(),
        plain.clone(),
        c.clone(),
        a2.clone(),
        c.clone(),
        throttled.clone(),
    ];
    let out = t.publish_batch(batch).await?;
    let dups: Vec<_> = out
        .duplicates
        .iter()
        .map(|d| (d.id, d.existing, d.replaced))
        .collect();
    assert_eq!(
        dups,
        [(b.id, held.id, false), (a2.id, a.id, false)],
        "a batch's duplicates differ from one-by-one publishes'"
    );
    let got = t.reserve_batch(&q, 20).await?;
    let mut kinds: Vec<_> = got.iter().map(|r| r.envelope.kind.as_str()).collect();
    // Where publishing an id twice stores it twice (RabbitMQ), `c` goes out again.
    let mut expected = vec!["held", "a", "plain", "c", "d"];
    if !t.capabilities().idempotent_publish {
        expected.insert(4, "c");
    }
    if !t.capabilities().exact_fifo {
        kinds.sort_unstable();
        expected.sort_unstable();
    }
    assert_eq!(
        kinds, expected,
        "a batch stored other jobs, or reordered them"
    );
    t.ack_batch(&got).await?;

    // The jobs are gone: their keys are free, but the throttle's is held for its ttl.
    let (a3, c3, e) = (
        keyed(&q, "a3", Unique::new("a")),
        keyed(&q, "c3", Unique::new("c")),
        keyed(&q, "e", Unique::new("e")),
    );
    let d2 = keyed(&q, "d2", Unique::throttle("d", Duration::from_secs(3600)));
    let out = t
        .publish_batch(vec![a3.clone(), d2.clone(), c3.clone(), e.clone()])
        .await?;
    let dups: Vec<_> = out.duplicates.iter().map(|d| (d.id, d.existing)).collect();
    assert_eq!(dups, [(d2.id, throttled.id)], "{out:?}");
    let got = t.reserve_batch(&q, 20).await?;
    let mut ids: Vec<_> = got.iter().map(|r| r.id()).collect();
    let mut expected = vec![a3.id, c3.id, e.id];
    if !t.capabilities().exact_fifo {
        ids.sort_unstable();
        expected.sort_unstable();
    }
    assert_eq!(ids, expected, "a key whose job was gone was not taken over");
    t.ack_batch(&got).await?;

    // A message under the id of a job that is gone, whose key's row still names that
    // job, takes the key afresh, beside a fresh key.
    let plain = super::case_support::message(&q, "plain2");
    let mut acked_id = keyed(&q, "acked-id", Unique::new("a"));
    acked_id.id = a3.id;
    let z = keyed(&q, "z", Unique::new("z"));
    let out = t
        .publish_batch(vec![plain.clone(), acked_id.clone(), z.clone()])
        .await?;
    assert!(out.duplicates.is_empty(), "{out:?}");
    let got = t.reserve_batch(&q, 20).await?;
    let mut kinds: Vec<_> = got.iter().map(|r| r.envelope.kind.as_str()).collect();
    let mut expected = vec!["plain2", "acked-id", "z"];
    if !t.capabilities().exact_fifo {
        kinds.sort_unstable();
        expected.sort_unstable();
    }
    assert_eq!(
        kinds, expected,
        "a gone job's id did not take its key afresh"
    );
    t.ack_batch(&got).await?;
    Ok(())
}

/// Four publishers racing batches over the same 200 keys, each batch's keys in another
/// order and some twice, leave exactly one job per key, and every duplicate names the
/// job that is stored.
pub async fn racing_batches_leave_one_job_per_key(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let q = fresh_queue();
    let first = store.open(super::harness::OpenOptions::default()).await?;
    if !unique_keys_apply(first.as_ref(), &q).await? {
        return Ok(());
    }
    const PUBLISHERS: usize = 4;
    const BATCHES: usize = 20;
    const BATCH: usize = 40;
    const KEYS: usize = 200;
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let t = store.open(super::harness::OpenOptions::default()).await?;
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let (mut stored, mut dups) = (Vec::new(), Vec::new());
            for n in 0..BATCHES {
                // Publishers walk the keys from other starting points, two of them
                // backwards, and repeat each batch's first key at its end.
                let mut keys: Vec<String> = (0..BATCH - 1)
                    .map(|i| {
                        let k = (n * 37 + p * 53 + i * 7) % KEYS;
                        format!("key-{}", if p % 2 == 0 { k } else { KEYS - 1 - k })
                    })
                    .collect();
                keys.push(keys[0].clone());
                let batch: Vec<Envelope> = keys
                    .iter()
                    .map(|k| keyed(&q, "k", Unique::new(k.clone())))
                    .collect();
                let out = t.publish_batch(batch.clone()).await?;
                for (env, key) in batch.iter().zip(keys) {
                    match out.duplicate_of(env.id) {
                        None => stored.push((key, env.id)),
                        Some(d) => dups.push((key, d.existing)),
                    }
                }
            }
            Ok::<_, Error>((stored, dups))
        }));
    }
    let (stored, dups) = one_job_per_key(first.as_ref(), &q, tasks).await?;
    assert_eq!(stored + dups, PUBLISHERS * BATCHES * BATCH);
    Ok(())
}

/// A key that breaks the rules is refused with what is accepted, and nothing is
/// stored; so is a debounce of a message with an ordering key.
pub async fn invalid_unique_keys_are_refused(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    let built = Envelope::builder(q.as_str(), "k")
        .unique(Unique::new(" padded"))
        .build();
    assert!(
        matches!(&built, Err(Error::InvalidInput(m)) if m.contains("unique key")),
        "{built:?}"
    );
    let debounce_in_order = Envelope::builder(q.as_str(), "k")
        .ordering_key("order-1")
        .unique(Unique::debounce("k", Duration::from_secs(1)))
        .build();
    assert!(
        matches!(&debounce_in_order, Err(Error::InvalidInput(m)) if m.contains("ordering key")),
        "{debounce_in_order:?}"
    );
    // Envelopes are plain data: one built by hand is checked when published.
    let mut by_hand = super::case_support::message(&q, "k");
    by_hand.unique = Some(Unique::new("k").throttled(Duration::ZERO));
    let refused = t.publish(by_hand).await;
    assert!(
        matches!(&refused, Err(Error::InvalidInput(m)) if m.contains("ttl")),
        "{refused:?}"
    );
    assert_eq!(
        stats_of(t.as_ref(), &q).await?.ready,
        0,
        "a refused publish stored"
    );
    Ok(())
}
