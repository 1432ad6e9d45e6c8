//! The worker runtime's rules, checked against a real transport.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::case_support::applies;
use super::faulty::Faulty;
use super::harness::{Harness, OpenOptions};
pub use super::shutdown_cases::*;
pub use super::suspect_cases::*;
pub use super::upkeep_cases::*;
use super::worker_support::{
    assert_nothing_left, drain, drain_counting, fast, fresh_queue, job, only_dead, open, record,
    stats_of, Calls,
};
use crate::worker::{handler_fn, JobContext, JobError, RetryPolicy, UnknownKind, Worker};
use crate::{reason, Envelope, Error, Result, Transport, TransportExt};

/// The worker handles every message once and acks them in batches.
pub async fn worker_handles_every_message_once_and_coalesces_acks(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let (_store, inner) = open(&h, Duration::from_secs(30)).await?;
    let mut faulty = Faulty::new(inner);
    faulty.slowest_ack = Some(Duration::from_millis(2));
    let t = Arc::new(faulty);
    let q = fresh_queue();
    let all: Vec<Envelope> = (0..1_000).map(|_| job(&q, "count")).collect();
    t.publish_batch(all.clone()).await?;
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast().with_concurrency(8)).handle(
        "count",
        handler_fn(move |ctx: JobContext| {
            record(&c, &ctx);
            async { Ok(()) }
        }),
    );
    let report = drain(worker).await?;
    assert_eq!(report.succeeded, 1_000, "{report:?}");
    let calls = calls.lock().expect("calls lock").clone();
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for (id, _, _) in calls.iter() {
        *seen.entry(*id).or_default() += 1;
    }
    assert_eq!(seen.len(), 1_000);
    assert!(
        seen.values().all(|n| *n == 1),
        "a message was handled twice"
    );
    let acks = t.ack_calls.load(Ordering::SeqCst);
    assert!(
        acks <= 125,
        "{acks} ack round trips for 1,000 messages: acks are not coalesced"
    );
    assert_nothing_left(t.as_ref(), &q).await?;
    Ok(())
}

/// A failing job is retried with backoff within the jitter bounds, then dead-lettered
/// with reason `max_attempts` and its last error.
pub async fn worker_retries_with_backoff_then_dead_letters(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    t.publish(job(&q, "flaky")).await?;
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let policy = RetryPolicy::new(Duration::from_millis(200), Duration::from_millis(300), 3);
    let worker = Worker::new(t.clone(), q.clone(), fast().with_retry(policy.clone())).handle(
        "flaky",
        handler_fn(move |ctx: JobContext| {
            record(&c, &ctx);
            async { Err(JobError::retry("upstream said 503")) }
        }),
    );
    let report = drain(worker).await?;
    assert_eq!((report.retried, report.dead_lettered), (2, 1), "{report:?}");
    let calls = calls.lock().expect("calls lock").clone();
    let attempts: Vec<u32> = calls.iter().map(|c| c.1).collect();
    assert_eq!(attempts, [1, 2, 3]);
    for (i, pair) in calls.windows(2).enumerate() {
        let gap = pair[1].2.duration_since(pair[0].2);
        // Full jitter: anywhere from 0 to the ceiling, plus polling slack.
        let ceiling = policy.ceiling(u32::try_from(i).unwrap_or(0) + 1);
        assert!(
            gap <= ceiling + Duration::from_millis(400),
            "retry {i} came after {gap:?}, ceiling {ceiling:?}"
        );
    }
    let d = only_dead(t.as_ref(), &q).await?;
    assert_eq!(d.reason, reason::MAX_ATTEMPTS);
    assert_eq!(d.attempts, 3);
    assert_eq!(d.last_error.as_deref(), Some("upstream said 503"));
    Ok(())
}

/// `max_attempts` on the message overrides the policy; `retry_after` overrides the
/// backoff; `fail` dead-letters at once with reason `failed`.
pub async fn worker_honours_max_attempts_retry_after_and_fail(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let once = Envelope::builder(q.as_str(), "once")
        .max_attempts(1)
        .build()?;
    let later = job(&q, "later");
    let doomed = job(&q, "doomed");
    t.publish_batch(vec![once.clone(), later.clone(), doomed.clone()])
        .await?;
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let worker =
        Worker::new(t.clone(), q.clone(), fast()).handle_any(handler_fn(move |ctx: JobContext| {
            record(&c, &ctx);
            async move {
                match (ctx.envelope.kind.as_str(), ctx.attempt) {
                    ("once", _) => Err(JobError::retry("once is enough")),
                    ("later", 1) => {
                        Err(JobError::retry_after(Duration::from_millis(600), "not yet"))
                    }
                    ("later", _) => Ok(()),
                    _ => Err(JobError::fail("invalid invoice: no customer")),
                }
            }
        }));
    drain(worker).await?;
    let calls = calls.lock().expect("calls lock").clone();
    let of = |id: Uuid| {
        calls
            .iter()
            .filter(|c| c.0 == id)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(of(once.id).len(), 1, "max_attempts 1 means one delivery");
    assert_eq!(of(doomed.id).len(), 1, "fail means no retry");
    let later_calls = of(later.id);
    assert_eq!(later_calls.len(), 2);
    let gap = later_calls[1].2.duration_since(later_calls[0].2);
    assert!(
        gap >= Duration::from_millis(550),
        "retry_after(600ms) came after {gap:?}"
    );
    let dead = t.dead_list(Some(&q), 10).await?;
    let reason_of = |id: Uuid| {
        dead.iter()
            .find(|d| d.id == id.to_string())
            .map(|d| d.reason.clone())
    };
    assert_eq!(reason_of(once.id).as_deref(), Some(reason::MAX_ATTEMPTS));
    assert_eq!(reason_of(doomed.id).as_deref(), Some(reason::FAILED));
    assert_eq!(reason_of(later.id), None);
    Ok(())
}

/// A handler that snoozes or is rate limited runs again after the wait, at the same
/// attempt: with `max_attempts(1)` a counted attempt would dead-letter it.
pub async fn worker_snoozes_without_counting_an_attempt(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let env = Envelope::builder(q.as_str(), "api_call")
        .max_attempts(1)
        .build()?;
    t.publish(env.clone()).await?;
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let worker =
        Worker::new(t.clone(), q.clone(), fast()).handle_any(handler_fn(move |ctx: JobContext| {
            record(&c, &ctx);
            let runs = c.lock().map(|calls| calls.len()).unwrap_or(0);
            async move {
                match runs {
                    1 => Err(JobError::snooze(Duration::from_millis(300))),
                    2 => Err(JobError::rate_limited(Duration::from_millis(300))),
                    _ => Ok(()),
                }
            }
        }));
    drain(worker).await?;
    let calls = calls.lock().expect("calls lock").clone();
    assert_eq!(calls.len(), 3, "two waits, then the run that succeeded");
    assert!(
        calls
            .iter()
            .all(|(id, attempt, _)| *id == env.id && *attempt == 1),
        "a wait counted an attempt: {calls:?}"
    );
    for pair in calls.windows(2) {
        let gap = pair[1].2.duration_since(pair[0].2);
        assert!(gap >= Duration::from_millis(250), "came back after {gap:?}");
    }
    assert_nothing_left(t.as_ref(), &q).await?;
    assert!(t.dead_list(Some(&q), 10).await?.is_empty());
    Ok(())
}

/// An unknown kind is dead-lettered with reason `no_handler`, or released when so
/// configured.
pub async fn worker_dead_letters_or_releases_unknown_kinds(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    t.publish(job(&q, "mystery")).await?;
    let worker = Worker::new(t.clone(), q.clone(), fast())
        .handle("known", handler_fn(|_ctx: JobContext| async { Ok(()) }));
    drain(worker).await?;
    let d = only_dead(t.as_ref(), &q).await?;
    assert_eq!(d.reason, reason::NO_HANDLER);
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("mystery")),
        "{d:?}"
    );

    let q2 = fresh_queue();
    t.publish(job(&q2, "mystery")).await?;
    let options = fast()
        .with_drain(false)
        .with_unknown_kind(UnknownKind::Release(Duration::from_secs(3600)));
    let worker = Worker::new(t.clone(), q2.clone(), options)
        .handle("known", handler_fn(|_ctx: JobContext| async { Ok(()) }));
    let counters = worker.counters();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.retried.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the unknown kind was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await
        .map_err(|e| Error::InvalidInput(e.to_string()))??;
    let s = stats_of(t.as_ref(), &q2).await?;
    assert_eq!(s.dead, 0, "{s:?}");
    if t.capabilities().delayed_stats {
        assert_eq!(s.delayed, 1, "{s:?}");
    }
    Ok(())
}

/// A message past its expiry is never handled; it is dead-lettered with reason
/// `expired`.
pub async fn worker_never_handles_expired_messages(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let stale = Envelope::builder(q.as_str(), "stale")
        .expires_at(chrono::Utc::now() - chrono::TimeDelta::seconds(1))
        .build()?;
    t.publish(stale).await?;
    assert_eq!(
        drain_counting(t.clone(), &q).await?,
        0,
        "an expired message was handled"
    );
    assert_eq!(only_dead(t.as_ref(), &q).await?.reason, reason::EXPIRED);
    Ok(())
}

/// Where the backend does not enforce expiry, the worker does: a message that expires
/// after it was claimed and before a handler starts is dead-lettered as `expired`.
pub async fn worker_checks_expiry_where_the_backend_does_not(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, inner) = open(&h, Duration::from_secs(30)).await?;
    let mut faulty = Faulty::new(inner);
    faulty.no_expiry_with_slow_claims = Some(Duration::from_millis(800));
    let t = Arc::new(faulty);
    let q = fresh_queue();
    let soon = Envelope::builder(q.as_str(), "soon")
        .expires_in(Duration::from_millis(300))
        .build()?;
    t.publish(soon).await?;
    assert_eq!(
        drain_counting(t.clone(), &q).await?,
        0,
        "an expired message was handled"
    );
    let dead = only_dead(t.as_ref(), &q).await?;
    assert_eq!(dead.reason, reason::EXPIRED);
    assert_eq!(
        dead.attempts, 0,
        "a message that never ran was charged an attempt"
    );
    Ok(())
}

/// The heartbeat keeps a job that runs longer than the visibility timeout leased: no
/// other worker gets it, and it is handled once.
pub async fn heartbeat_keeps_a_long_job_from_being_reclaimed(h: Arc<dyn Harness>) -> Result<()> {
    let lease = Duration::from_millis(1500);
    let (store, t) = open(&h, lease).await?;
    if !t.capabilities().lease_extension {
        return Ok(());
    }
    let rival = store
        .open(OpenOptions {
            visibility_timeout: lease,
            ..OpenOptions::default()
        })
        .await?;
    let q = fresh_queue();
    t.publish(job(&q, "long")).await?;
    let stolen = Arc::new(AtomicBool::new(false));
    let (q2, s2, r2) = (q.clone(), stolen.clone(), rival.clone());
    let worker = Worker::new(t.clone(), q.clone(), fast()).handle(
        "long",
        handler_fn(move |ctx: JobContext| {
            let (q, stolen, rival) = (q2.clone(), s2.clone(), r2.clone());
            async move {
                // Nearly three visibility timeouts, with a rival trying to reserve throughout.
                let until = Instant::now() + Duration::from_millis(4_000);
                while Instant::now() < until {
                    if rival
                        .reserve(&q)
                        .await
                        .map_err(|e| JobError::retry(e.to_string()))?
                        .is_some()
                    {
                        stolen.store(true, Ordering::SeqCst);
                    }
                    assert!(!ctx.cancel.is_cancelled(), "the handler was cancelled");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            }
        }),
    );
    let report = drain(worker).await?;
    assert!(
        !stolen.load(Ordering::SeqCst),
        "a rival reserved the job while it ran"
    );
    assert_eq!((report.succeeded, report.lost), (1, 0), "{report:?}");
    Ok(())
}

/// When a heartbeat finds the lease lost, the handler's cancellation token fires at once
/// and the worker neither acks nor releases the message.
pub async fn lost_lease_cancels_the_handler_at_once(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, inner) = open(&h, Duration::from_millis(600)).await?;
    if !applies(
        inner.as_ref(),
        "lease_expiry",
        inner.capabilities().lease_expiry,
    ) {
        return Ok(());
    }
    let t = Arc::new(Faulty::new(inner));
    t.extend_lost.store(true, Ordering::SeqCst);
    let q = fresh_queue();
    t.publish(job(&q, "fenced")).await?;
    let cancelled_after = Arc::new(Mutex::new(None));
    let c = cancelled_after.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast().with_drain(false)).handle(
        "fenced",
        handler_fn(move |ctx: JobContext| {
            let c = c.clone();
            async move {
                let started = Instant::now();
                tokio::select! {
                    _ = ctx.cancel.cancelled() => {
                        *c.lock().expect("lock") = Some(started.elapsed());
                    }
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
                Ok(())
            }
        }),
    );
    let counters = worker.counters();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.lost.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the lost lease was not noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let report = run
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))??;
    let after = cancelled_after.lock().expect("lock").take();
    // The first beat comes at a third of the lease (200 ms): the token fires then.
    assert!(
        after.is_some_and(|d| d < Duration::from_secs(2)),
        "cancelled after {after:?}"
    );
    assert_eq!(
        (report.succeeded, report.retried, report.dead_lettered),
        (0, 0, 0),
        "{report:?}"
    );
    assert_eq!(
        t.ack_calls.load(Ordering::SeqCst),
        0,
        "a fenced job was acked"
    );
    Ok(())
}

/// A handler that outlives the timeout is cancelled and the delivery counts as a failure.
pub async fn handler_timeout_cancels_and_counts_a_failure(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let slow = Envelope::builder(q.as_str(), "slow")
        .max_attempts(2)
        .build()?;
    t.publish(slow).await?;
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let worker = Worker::new(
        t.clone(),
        q.clone(),
        fast().with_timeout(Some(Duration::from_millis(200))),
    )
    .handle(
        "slow",
        handler_fn(move |_ctx: JobContext| {
            let guard = DropCounter(d.clone());
            async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            }
        }),
    );
    let started = Instant::now();
    let report = drain(worker).await?;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the timeout did not stop the handler"
    );
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "the timed-out handlers were not cancelled"
    );
    assert_eq!((report.retried, report.dead_lettered), (1, 1), "{report:?}");
    let dead = only_dead(t.as_ref(), &q).await?;
    assert_eq!(dead.reason, reason::MAX_ATTEMPTS);
    assert!(
        dead.last_error
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{dead:?}"
    );
    Ok(())
}

/// A panicking handler is recorded as the error and never takes the worker down.
pub async fn handler_panic_is_isolated_and_recorded(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let bomb = Envelope::builder(q.as_str(), "bomb")
        .max_attempts(1)
        .build()?;
    t.publish(bomb).await?;
    t.publish_batch((0..50).map(|_| job(&q, "fine")).collect())
        .await?;
    let worker = Worker::new(t.clone(), q.clone(), fast().with_concurrency(4)).handle_any(
        handler_fn(|ctx: JobContext| async move {
            if ctx.envelope.kind == "bomb" {
                panic!("boom: index out of range");
            }
            Ok(())
        }),
    );
    let report = drain(worker).await?;
    assert_eq!(
        (report.succeeded, report.dead_lettered),
        (50, 1),
        "{report:?}"
    );
    let dead = only_dead(t.as_ref(), &q).await?;
    assert!(
        dead.last_error
            .as_deref()
            .is_some_and(|e| e.contains("panicked") && e.contains("boom")),
        "{dead:?}"
    );
    Ok(())
}

/// An idle worker wakes when a message arrives, if the transport offers a wake-up signal,
/// rather than after its longest poll pause.
pub async fn idle_worker_wakes_on_publish(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    if t.wake_signal(&q).is_none() {
        return Ok(());
    }
    let options = fast()
        .with_drain(false)
        .with_poll(Duration::from_secs(30), Duration::from_secs(30));
    let got = Arc::new(tokio::sync::Notify::new());
    let g = got.clone();
    let worker = Worker::new(t.clone(), q.clone(), options).handle_any(handler_fn(
        move |_ctx: JobContext| {
            g.notify_one();
            async { Ok(()) }
        },
    ));
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await; // the worker is now asleep
    t.publish(job(&q, "ping")).await?;
    let woke = tokio::time::timeout(Duration::from_secs(10), got.notified()).await;
    stop.cancel();
    run.await
        .map_err(|e| Error::InvalidInput(e.to_string()))??;
    assert!(
        woke.is_ok(),
        "the worker slept through the publish (poll pause 30 s)"
    );
    Ok(())
}

struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A worker that selects labels handles only messages carrying one of them, and leaves
/// the rest on the queue; a backend that cannot select refuses to start such a worker.
pub async fn worker_with_labels_handles_only_those(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    let mut jobs = Vec::new();
    for i in 0..12 {
        let colour = if i % 3 == 0 { "red" } else { "blue" };
        jobs.push(
            Envelope::builder(q.as_str(), colour)
                .label(colour)
                .build()?,
        );
    }
    jobs.push(job(&q, "plain"));
    t.publish_batch(jobs).await?;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let worker = Worker::new(
        t.clone(),
        q.clone(),
        fast().with_labels(["red"]).with_name("red-only"),
    )
    .handle_any(handler_fn(move |ctx: JobContext| {
        s.lock().expect("seen lock").push(ctx.envelope.kind.clone());
        async { Ok(()) }
    }));
    if !t.capabilities().label_claims {
        let refused = drain(worker).await;
        assert!(
            matches!(refused, Err(Error::NotSupported(_))),
            "a worker that selects labels started: {refused:?}"
        );
        return Ok(());
    }
    drain(worker).await?;
    let seen = seen.lock().expect("seen lock").clone();
    assert_eq!(seen, vec!["red"; 4], "the red worker handled {seen:?}");
    let left = stats_of(t.as_ref(), &q).await?;
    assert_eq!(
        left.ready, 9,
        "blue and unlabelled messages are left: {left:?}"
    );
    Ok(())
}
