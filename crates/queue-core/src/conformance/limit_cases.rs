//! Cases of limits: slots held by leases across workers, a stale lease freeing nothing,
//! and a rate that spaces starts without counting attempts.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::harness::{open_beside, Beside, Harness};
use super::worker_support::{drain, fast, fresh_queue};
use crate::limit::{Acquired, Limit, Want};
use crate::limit_store::{LimitLease, LimitStore, Parked};
use crate::reservation::Reservation;
use crate::status::StatusStore;
use crate::transport_ext::TransportExt;
use crate::worker::{handler_fn, JobContext, Worker};
use crate::{Envelope, QueueName, Result, Transport};

/// A fresh store's transport, status store and limit store, or `None` (said why) where
/// the backend keeps no limits (RabbitMQ without a control store).
async fn open_limited(h: &Arc<dyn Harness>) -> Result<Option<Beside<dyn LimitStore>>> {
    let limits = |s: Option<&dyn StatusStore>, caps: &crate::Capabilities| {
        let limits = s.and_then(|s| s.limits());
        assert_eq!(
            caps.limits,
            limits.is_some(),
            "the capability `limits` says otherwise than the store beside the transport"
        );
        limits
    };
    open_beside(h, limits, "no store beside it keeps limits").await
}

/// As [`open_limited`], where the store can also park a queued job (said why not).
async fn open_parking(h: &Arc<dyn Harness>) -> Result<Option<Beside<dyn LimitStore>>> {
    let Some(opened) = open_limited(h).await? else {
        return Ok(None);
    };
    if !opened.1.capabilities().limit_parking {
        eprintln!(
            "not applicable to {}: it cannot set a queued job aside",
            opened.1.name()
        );
        return Ok(None);
    }
    Ok(Some(opened))
}

fn keyed(q: &QueueName, key: &str, n: usize) -> Envelope {
    Envelope::builder(q.as_str(), "call")
        .payload(&serde_json::json!({ "k": key, "n": n }))
        .build()
        .expect("a valid envelope")
}

/// Per key: how many run now, and the most that ever ran at once.
type Probe = Arc<Mutex<HashMap<String, (usize, usize)>>>;

/// A limit of 2 per key holds across two workers of 8 handlers each: never more than 2
/// of a key run at once, every job runs once and on its first attempt (waits count
/// none), and no slot is held once they are done.
pub async fn a_concurrency_limit_holds_across_workers(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, limits)) = open_limited(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let mut envs = Vec::new();
    for key in ["a", "b", "c"] {
        for n in 0..6 {
            envs.push(keyed(&q, key, n));
        }
    }
    t.publish_batch(envs.clone()).await?;
    let probe: Probe = Arc::default();
    let runs: Arc<Mutex<Vec<(uuid::Uuid, u32)>>> = Arc::default();
    let worker = || {
        let (probe, runs) = (probe.clone(), runs.clone());
        Worker::new(t.clone(), q.clone(), fast().with_concurrency(8))
            .with_status(status.clone())
            .limit(Limit::per_field("/k").concurrency(2))
            .handle_any(handler_fn(move |ctx: JobContext| {
                let (probe, runs) = (probe.clone(), runs.clone());
                async move {
                    let key: serde_json::Value = ctx
                        .payload()
                        .map_err(|e| crate::worker::JobError::fail(e.to_string()))?;
                    let key = key["k"].as_str().unwrap_or_default().to_owned();
                    if let Ok(mut p) = probe.lock() {
                        let e = p.entry(key.clone()).or_default();
                        e.0 += 1;
                        e.1 = e.1.max(e.0);
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    if let Ok(mut p) = probe.lock() {
                        if let Some(e) = p.get_mut(&key) {
                            e.0 -= 1;
                        }
                    }
                    if let Ok(mut r) = runs.lock() {
                        r.push((ctx.envelope.id, ctx.attempt));
                    }
                    Ok(())
                }
            }))
    };
    let (one, two) = tokio::join!(drain(worker()), drain(worker()));
    one?;
    two?;
    let probe = probe.lock().expect("the probe").clone();
    for (key, (_, most)) in &probe {
        assert!(
            *most <= 2,
            "key {key}: {most} ran at once under a limit of 2"
        );
    }
    assert!(
        probe.values().any(|(_, most)| *most == 2),
        "no key ever ran two at once: {probe:?}"
    );
    let runs = runs.lock().expect("the runs").clone();
    let ids: HashSet<_> = runs.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        runs.len(),
        envs.len(),
        "a job ran twice or not at all: {runs:?}"
    );
    assert_eq!(ids.len(), envs.len());
    assert!(
        runs.iter().all(|(_, attempt)| *attempt == 1),
        "a wait for a slot counted an attempt: {runs:?}"
    );
    let held: u64 = limits
        .usage()
        .await?
        .iter()
        .filter(|u| u.queue == q.as_str())
        .map(|u| u.running)
        .sum();
    assert_eq!(held, 0, "slots stayed held after every job was done");
    Ok(())
}

/// A lease's slot counts until its hold runs out, and then is another's: the stale
/// lease's free and renewal touch nothing of its successor's (even of the same job).
pub async fn a_stale_lease_frees_no_slot(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, _t, _status, limits)) = open_limited(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let want = [Limit::per_queue().concurrency(1).want("queue".to_owned())];
    let lease = |id: &'static str, token: &'static str| LimitLease {
        queue: q.as_str(),
        id,
        token,
    };
    let (stale, other, successor) = (lease("x", "t1"), lease("y", "t2"), lease("x", "t3"));
    let hold = Duration::from_millis(400);
    let limits = limits.as_ref();
    let take = |l| limits.acquire(l, hold, &want);
    assert_eq!(take(stale).await?, Acquired::Granted);
    assert!(
        matches!(take(other).await?, Acquired::Wait { .. }),
        "a second job took the only slot"
    );
    assert!(
        matches!(take(successor).await?, Acquired::Wait { .. }),
        "the job's next lease took the slot while the first still held it"
    );
    assert!(
        limits.extend(stale, hold).await?,
        "a live slot was not renewed"
    );
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    // The successor holds its slot for long: with a hold as short as the first, a slow
    // round trip or two (TLS in CI) let it run out before the checks below.
    assert_eq!(
        limits
            .acquire(successor, Duration::from_secs(60), &want)
            .await?,
        Acquired::Granted,
        "a run-out slot stayed held"
    );
    // The stale lease wakes up: its renewal fails and its free frees nothing.
    assert!(
        !limits.extend(stale, hold).await?,
        "a run-out slot was renewed"
    );
    limits.release(stale).await?;
    assert!(
        matches!(take(other).await?, Acquired::Wait { .. }),
        "the stale lease's free freed its successor's slot"
    );
    assert!(limits.extend(successor, hold).await?);
    limits.release(successor).await?;
    assert_eq!(take(other).await?, Acquired::Granted);
    limits.release(other).await?;
    Ok(())
}

/// A rate of 20 a second with a burst of 2 never starts jobs ahead of its schedule, and
/// the jobs it holds back run on their first attempt.
pub async fn a_rate_limit_spaces_starts_without_counting_attempts(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let Some((_store, t, status, _limits)) = open_limited(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let envs: Vec<Envelope> = (0..12).map(|n| keyed(&q, "a", n)).collect();
    t.publish_batch(envs.clone()).await?;
    let starts: Arc<Mutex<Vec<(Instant, u32)>>> = Arc::default();
    let s = starts.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast().with_concurrency(8))
        .with_status(status)
        .limit(Limit::per_queue().rate(20, Duration::from_secs(1)).burst(2))
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut s) = s.lock() {
                s.push((Instant::now(), ctx.attempt));
            }
            async { Ok(()) }
        }));
    drain(worker).await?;
    let mut starts = starts.lock().expect("the starts").clone();
    assert_eq!(starts.len(), envs.len(), "not every job ran once");
    assert!(
        starts.iter().all(|(_, a)| *a == 1),
        "a wait for a token counted an attempt"
    );
    starts.sort_by_key(|(at, _)| *at);
    // Never ahead of the rate: the k-th start (from 0) comes no sooner than
    // (k + 1 - burst) / rate after the first. (A job back late for its booked start may
    // run at once, so starts can bunch up behind the schedule, never ahead of it.)
    let first = starts[0].0;
    for (k, (at, _)) in starts.iter().enumerate() {
        let earliest = (k as f64 + 1.0 - 2.0).max(0.0) / 20.0 - 0.02;
        let after = at.duration_since(first).as_secs_f64();
        assert!(
            after >= earliest,
            "start {k} came {after:.3} s after the first, before {earliest:.3} s: ahead of 20/s with a burst of 2"
        );
    }
    Ok(())
}

/// Reserves one message of `q`, polling for up to 3 s (a woken job is due at once, but
/// a claim promotes due rows only now and then).
async fn reserve_soon(t: &dyn Transport, q: &QueueName) -> Result<Option<Reservation>> {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(r) = t.reserve(q).await? {
            return Ok(Some(r));
        }
        if Instant::now() > until {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new lease of the job `r` (its id, a fresh token).
fn lease_of(r: &Reservation) -> (String, String) {
    (r.id().to_string(), uuid::Uuid::new_v4().to_string())
}

/// The limit lease of `(id, token)` in `q`.
fn lease_on<'a>(q: &'a QueueName, (id, token): &'a (String, String)) -> LimitLease<'a> {
    LimitLease {
        queue: q.as_str(),
        id,
        token,
    }
}

/// Claims each of `envs` in turn (in publish order), is denied its key's slot and
/// parks it.
async fn park_each(
    t: &dyn Transport,
    limits: &dyn LimitStore,
    q: &QueueName,
    envs: &[Envelope],
    want: &[Want],
    backstop: Duration,
) -> Result<()> {
    for env in envs {
        let r = t
            .reserve(q)
            .await?
            .expect("a job not parked yet is claimable");
        assert_eq!(r.id(), env.id, "a parked job was claimed again");
        let ids = lease_of(&r);
        let lease = lease_on(q, &ids);
        assert!(matches!(
            limits.acquire(lease, backstop, want).await?,
            Acquired::Wait { .. }
        ));
        assert_eq!(
            limits
                .park(lease, &r.token().to_string(), want, backstop)
                .await?,
            Parked::Parked
        );
    }
    Ok(())
}

/// Takes key `a`'s only slot (a limit of 1 per `/k`) for a holder that is no job: the
/// limit's want, the holder's lease, and the backstop of parks.
async fn take_the_only_slot<'a>(
    limits: &dyn LimitStore,
    q: &'a QueueName,
) -> Result<([Want; 1], LimitLease<'a>, Duration)> {
    let want = [Limit::per_field("/k").concurrency(1).want("a".to_owned())];
    let backstop = Duration::from_secs(300);
    let holder = LimitLease {
        queue: q.as_str(),
        id: "holder",
        token: "h1",
    };
    assert_eq!(
        limits.acquire(holder, backstop, &want).await?,
        Acquired::Granted
    );
    Ok((want, holder, backstop))
}

/// Where the store sits beside the jobs, a job that finds its key's only slot taken is
/// parked: no claim sees it again until the slot is released (which wakes the oldest
/// parked job, and only one) or runs out (which the workers' wake-up finds); a park that
/// finds the slot free, or a job not in the store's table, parks nothing.
pub async fn a_saturated_key_parks_its_jobs_until_a_slot_frees(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, _status, limits)) = open_parking(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let envs: Vec<Envelope> = (0..3).map(|n| keyed(&q, "a", n)).collect();
    t.publish_batch(envs.clone()).await?;
    let limits = limits.as_ref();
    let (want, holder, backstop) = take_the_only_slot(limits, &q).await?;
    park_each(t.as_ref(), limits, &q, &envs, &want, backstop).await?;
    assert!(t.reserve(&q).await?.is_none(), "a parked job was claimable");
    // The release wakes the oldest parked job, and only it.
    assert_eq!(limits.release(holder).await?, 1, "the release woke no job");
    let first = reserve_soon(t.as_ref(), &q)
        .await?
        .expect("the woken job is claimable");
    assert_eq!(
        first.id(),
        envs[0].id,
        "the release woke another than the oldest"
    );
    assert!(
        t.reserve(&q).await?.is_none(),
        "a release woke two jobs for one slot"
    );
    // Its slot runs out instead of being released: the wake-up of parked jobs finds it.
    let first_lease = lease_of(&first);
    let short = lease_on(&q, &first_lease);
    let brief = Duration::from_millis(300);
    assert_eq!(
        limits.acquire(short, brief, &want).await?,
        Acquired::Granted
    );
    assert_eq!(
        limits.wake_parked().await?,
        0,
        "a held slot's key woke a job"
    );
    tokio::time::sleep(brief + Duration::from_millis(200)).await;
    assert_eq!(limits.wake_parked().await?, 1, "a run-out slot woke no job");
    let second = reserve_soon(t.as_ref(), &q)
        .await?
        .expect("the job woken by the run-out slot is claimable");
    assert_eq!(second.id(), envs[1].id);
    // With the slot free, a park parks nothing; a lease that is not the job's neither.
    let second_lease = lease_of(&second);
    let lease = lease_on(&q, &second_lease);
    assert_eq!(
        limits
            .park(lease, &second.token().to_string(), &want, backstop)
            .await?,
        Parked::Free
    );
    assert_eq!(
        limits.acquire(lease, backstop, &want).await?,
        Acquired::Granted
    );
    let stranger = uuid::Uuid::new_v4().to_string();
    let first_again = lease_of(&first);
    let other = lease_on(&q, &first_again);
    assert_eq!(
        limits.park(other, &stranger, &want, backstop).await?,
        Parked::NotHere,
        "a park with another lease's token set the job aside"
    );
    t.ack(&first).await?;
    t.ack(&second).await?;
    assert_eq!(limits.release(lease).await?, 1);
    let third = reserve_soon(t.as_ref(), &q)
        .await?
        .expect("the last parked job is woken");
    assert_eq!(third.id(), envs[2].id);
    t.ack(&third).await?;
    Ok(())
}

/// A woken job goes back in line as of when it first parked: a job of its key published
/// after it parked, and ready all along, is claimed after it, not before (else a busy
/// key's freed slots could go to newcomers while an old job parks again and again).
pub async fn a_woken_job_goes_before_its_keys_later_jobs(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, _status, limits)) = open_parking(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let old = keyed(&q, "a", 0);
    t.publish(old.clone()).await?;
    let limits = limits.as_ref();
    let (want, holder, backstop) = take_the_only_slot(limits, &q).await?;
    park_each(
        t.as_ref(),
        limits,
        &q,
        std::slice::from_ref(&old),
        &want,
        backstop,
    )
    .await?;
    // Clocks apart: the newcomer is stored well after the park.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let newcomer = keyed(&q, "a", 1);
    t.publish(newcomer.clone()).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A claim that came back empty: the next one takes ready rows before it promotes
    // due ones, as a busy worker's claims do.
    assert!(t.reserve(&fresh_queue()).await?.is_none());
    assert_eq!(limits.release(holder).await?, 1, "the release woke no job");
    let first = t.reserve(&q).await?.expect("a job is claimable at once");
    assert_eq!(
        first.id(),
        old.id,
        "the key's newcomer was claimed before the job woken for its slot"
    );
    let second = reserve_soon(t.as_ref(), &q)
        .await?
        .expect("the newcomer is claimable");
    assert_eq!(second.id(), newcomer.id);
    t.ack(&first).await?;
    t.ack(&second).await?;
    Ok(())
}

/// Jobs that take their limits in one batch are booked as if one after another: a rate
/// of 50 a second with a burst of 5 lets 5 of 40 start and books the rest 20 ms apart.
pub async fn a_batch_books_each_job_its_own_start(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, _t, _status, limits)) = open_limited(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let want = [Limit::per_queue()
        .rate(50, Duration::from_secs(1))
        .burst(5)
        .want("queue".to_owned())];
    let ids: Vec<String> = (0..40).map(|n| format!("job-{n}")).collect();
    let batch: Vec<(LimitLease<'_>, Duration, &[crate::limit::Want])> = ids
        .iter()
        .map(|id| {
            let lease = LimitLease {
                queue: q.as_str(),
                id,
                token: id,
            };
            (lease, Duration::from_secs(30), &want[..])
        })
        .collect();
    let began = Instant::now();
    let answers = limits.acquire_batch(&batch).await?;
    let took = began.elapsed();
    assert_eq!(answers.len(), ids.len(), "an answer per job");
    let granted = answers.iter().filter(|a| **a == Acquired::Granted).count();
    // The burst, and one more start for every 20 ms the batch itself took: a slow,
    // loaded machine may take longer than one start's interval over 40 bookings.
    let allowed = 5 + usize::try_from(took.as_millis() / 20).unwrap_or(usize::MAX);
    assert!(
        (5..=allowed).contains(&granted),
        "the burst is 5, plus 50/s over the {took:?} the batch took: {granted} started: {answers:?}"
    );
    // The booked come back, some on time and some early, in a batch with 20 new jobs;
    // then the next job is booked behind all 55, at least 56 × 20 ms after the first
    // batch began (no start given twice, none lost).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let more: Vec<String> = (40..60).map(|n| format!("job-{n}")).collect();
    let tokens: Vec<String> = ids.iter().map(|id| format!("{id}-again")).collect();
    let again: Vec<(LimitLease<'_>, Duration, &[crate::limit::Want])> = ids
        .iter()
        .zip(&tokens)
        .zip(&answers)
        .filter(|(_, a)| **a != Acquired::Granted)
        .map(|((id, token), _)| (id, token))
        .chain(more.iter().map(|id| (id, id)))
        .map(|(id, token)| {
            let lease = LimitLease {
                queue: q.as_str(),
                id,
                token,
            };
            (lease, Duration::from_secs(30), &want[..])
        })
        .collect();
    let second = limits.acquire_batch(&again).await?;
    let started = second.iter().filter(|a| **a == Acquired::Granted).count();
    // 300 ms at 50/s is 15 starts; a loaded machine that slept or booked longer has
    // earned one more per 20 ms it took, as the first batch's check allows.
    let since = began.elapsed();
    let earned = usize::try_from(since.as_millis() / 20)
        .unwrap_or(usize::MAX)
        .saturating_add(5)
        .saturating_sub(granted);
    assert!(
        (10..=earned.max(20)).contains(&started),
        "{started} of the booked started {since:?} after the first batch, at 50/s: {second:?}"
    );
    let next = LimitLease {
        queue: q.as_str(),
        id: "next",
        token: "next",
    };
    let Acquired::Wait { after, .. } = limits.acquire(next, Duration::from_secs(30), &want).await?
    else {
        panic!("a job after the batches started at once");
    };
    let least = Duration::from_millis(56 * 20).saturating_sub(began.elapsed());
    assert!(
        after + Duration::from_millis(5) >= least,
        "the job after the batches waits {after:?}, less than {least:?}: booked ahead of 50/s"
    );
    Ok(())
}
