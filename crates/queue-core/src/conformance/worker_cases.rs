//! The worker runtime's rules, checked against a real transport.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Harness, OpenOptions};
use crate::worker::{
    handler_fn, JobContext, JobError, RetryPolicy, UnknownKind, Worker, WorkerOptions,
};
use crate::{
    reason, AckReport, Capabilities, DeadLetter, DeadSelection, Envelope, Error, QueueName,
    QueueStats, Reservation, Result, Transport,
};

fn fresh_queue() -> QueueName {
    QueueName::new(format!("w-{}", Uuid::new_v4().simple())).expect("a valid queue name")
}

fn job(queue: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(queue.as_str(), kind)
        .build()
        .expect("a valid envelope")
}

/// Quick retries so the cases finish in seconds.
fn fast() -> WorkerOptions {
    WorkerOptions::default()
        .with_retry(RetryPolicy::new(
            Duration::from_millis(20),
            Duration::from_millis(80),
            3,
        ))
        .with_poll(Duration::from_millis(5), Duration::from_millis(50))
        .with_drain(true)
}

async fn open(
    h: &Arc<dyn Harness>,
    lease: Duration,
) -> Result<(Box<dyn super::Store>, Arc<dyn Transport>)> {
    let store = h.store().await?;
    let t = store
        .open(OpenOptions {
            visibility_timeout: lease,
            ..OpenOptions::default()
        })
        .await?;
    Ok((store, t))
}

async fn drain(worker: Worker) -> Result<crate::worker::WorkerReport> {
    tokio::time::timeout(
        Duration::from_secs(120),
        worker.run(CancellationToken::new()),
    )
    .await
    .map_err(|_| Error::InvalidInput("the worker did not drain within 120 s".into()))?
}

async fn stats_of(t: &dyn Transport, q: &QueueName) -> Result<QueueStats> {
    Ok(t.stats(Some(q))
        .await?
        .into_iter()
        .find(|s| s.queue == q.as_str())
        .unwrap_or_else(|| QueueStats::new(q.as_str())))
}

/// Nothing ready, delayed, reserved or dead is left on `q`.
async fn assert_nothing_left(t: &dyn Transport, q: &QueueName) -> Result<()> {
    let s = stats_of(t, q).await?;
    assert_eq!(
        (s.ready, s.delayed, s.reserved, s.dead),
        (0, 0, 0, 0),
        "left on {q}: {s:?}"
    );
    Ok(())
}

async fn only_dead(t: &dyn Transport, q: &QueueName) -> Result<DeadLetter> {
    let mut dead = t.dead_list(Some(q), 10).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    Ok(dead.remove(0))
}

/// Drains `q` with a handler that only counts its calls; returns the count.
async fn drain_counting(t: Arc<dyn Transport>, q: &QueueName) -> Result<usize> {
    let handled = Arc::new(AtomicUsize::new(0));
    let n = handled.clone();
    let worker =
        Worker::new(t, q.clone(), fast()).handle_any(handler_fn(move |_ctx: JobContext| {
            n.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        }));
    drain(worker).await?;
    Ok(handled.load(Ordering::SeqCst))
}

/// Records each call of a handler: (message id, attempt, when).
type Calls = Arc<Mutex<Vec<(Uuid, u32, Instant)>>>;

fn record(calls: &Calls, ctx: &JobContext) {
    calls
        .lock()
        .expect("calls lock")
        .push((ctx.envelope.id, ctx.attempt, Instant::now()));
}

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

/// On shutdown the worker stops reserving, lets quick jobs finish, and after the grace
/// period releases the unfinished ones so that they are delivered again at once.
pub async fn shutdown_finishes_quick_jobs_and_releases_the_rest(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(60)).await?;
    let q = fresh_queue();
    t.publish_batch((0..2).map(|_| job(&q, "quick")).collect())
        .await?;
    t.publish_batch((0..2).map(|_| job(&q, "stuck")).collect())
        .await?;
    let options = fast()
        .with_drain(false)
        .with_concurrency(4)
        .with_grace_period(Duration::from_millis(700));
    let worker = Worker::new(t.clone(), q.clone(), options).handle_any(handler_fn(
        |ctx: JobContext| async move {
            let pause = if ctx.envelope.kind == "quick" {
                300
            } else {
                30_000
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            Ok(())
        },
    ));
    let counters = worker.counters();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters.in_flight.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the jobs did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopping = Instant::now();
    stop.cancel();
    let report = run
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))??;
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    assert_eq!(
        (report.succeeded, report.released_on_shutdown),
        (2, 2),
        "{report:?}"
    );
    // Released for immediate redelivery, not left to their 60 s leases.
    let again = t.reserve_batch(&q, 10).await?;
    assert_eq!(again.len(), 2);
    assert!(again
        .iter()
        .all(|r| r.envelope.kind == "stuck" && r.envelope.attempts == 1));
    Ok(())
}

/// Shutdown returns promptly whatever the worker is doing when it comes: idle, claiming,
/// dispatching or flushing acks.
pub async fn shutdown_is_prompt_at_any_moment(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    for round in 0..12 {
        t.publish_batch((0..150).map(|_| job(&q, "fast")).collect())
            .await?;
        let worker = Worker::new(t.clone(), q.clone(), fast().with_drain(false))
            .handle_any(handler_fn(|_ctx: JobContext| async { Ok(()) }));
        let stop = CancellationToken::new();
        let run = tokio::spawn(worker.run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..40))).await;
        stop.cancel();
        match tokio::time::timeout(Duration::from_secs(10), run).await {
            Ok(joined) => {
                joined.map_err(|e| Error::InvalidInput(e.to_string()))??;
            }
            Err(_) => panic!("round {round}: the worker did not stop within 10 s of its shutdown"),
        }
    }
    // Whatever was claimed and not handled went back: the queue drains completely.
    let worker = Worker::new(t.clone(), q.clone(), fast())
        .handle_any(handler_fn(|_ctx: JobContext| async { Ok(()) }));
    drain(worker).await?;
    assert_nothing_left(t.as_ref(), &q).await?;
    Ok(())
}

/// An idle worker wakes when a message arrives, if the transport offers a wake-up signal,
/// rather than after its longest poll pause.
pub async fn idle_worker_wakes_on_publish(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    if t.waker(&q).is_none() {
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

/// Delegates to a real transport, counting ack round trips and, on demand, answering
/// every `extend` with `LeaseLost` (as if another worker had taken the message).
#[derive(Debug)]
struct Faulty {
    inner: Arc<dyn Transport>,
    extend_lost: AtomicBool,
    ack_calls: AtomicUsize,
    /// Pretend the backend does not enforce expiry, and hold claims this long before
    /// handing them over, so that they expire in the worker's buffer.
    no_expiry_with_slow_claims: Option<Duration>,
    /// Every ack call takes at least this long, as one that waits for a server does: an
    /// AMQP ack waits for no answer, and would often end before the next handler.
    slowest_ack: Option<Duration>,
}

impl Faulty {
    fn new(inner: Arc<dyn Transport>) -> Self {
        Faulty {
            inner,
            extend_lost: AtomicBool::new(false),
            ack_calls: AtomicUsize::new(0),
            no_expiry_with_slow_claims: None,
            slowest_ack: None,
        }
    }
}

#[async_trait]
impl Transport for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.no_expiry_with_slow_claims.is_some() {
            caps.expiry = false;
        }
        caps
    }
    fn visibility_timeout(&self) -> Duration {
        self.inner.visibility_timeout()
    }
    fn waker(&self, queue: &QueueName) -> Option<Arc<tokio::sync::Notify>> {
        self.inner.waker(queue)
    }
    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<()> {
        self.inner.publish_batch(envelopes).await
    }
    async fn reserve_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.inner.reserve_batch(queue, max).await
    }
    async fn prefetch_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        let claimed = self.inner.prefetch_batch(queue, max).await?;
        if let (Some(hold), false) = (self.no_expiry_with_slow_claims, claimed.is_empty()) {
            tokio::time::sleep(hold).await;
        }
        Ok(claimed)
    }
    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        self.inner.start_batch(reservations).await
    }
    async fn abandon(&self, r: &Reservation) -> Result<()> {
        self.inner.abandon(r).await
    }
    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        self.ack_calls.fetch_add(1, Ordering::SeqCst);
        let floor = tokio::time::sleep(self.slowest_ack.unwrap_or_default());
        let (acked, ()) = tokio::join!(self.inner.ack_batch(reservations), floor);
        acked
    }
    async fn release(&self, r: &Reservation, delay: Duration, error: Option<&str>) -> Result<()> {
        self.inner.release(r, delay, error).await
    }
    async fn dead_letter(&self, r: &Reservation, why: &str, error: Option<&str>) -> Result<()> {
        self.inner.dead_letter(r, why, error).await
    }
    async fn extend(&self, r: &Reservation, lease: Duration) -> Result<()> {
        if self.extend_lost.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost { message_id: r.id() });
        }
        self.inner.extend(r, lease).await
    }
    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        self.inner.stats(queue).await
    }
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.inner.dead_list(queue, limit).await
    }
    async fn dead_replay(&self, queue: Option<&QueueName>, s: &DeadSelection) -> Result<u64> {
        self.inner.dead_replay(queue, s).await
    }
    async fn dead_purge(&self, queue: Option<&QueueName>, s: &DeadSelection) -> Result<u64> {
        self.inner.dead_purge(queue, s).await
    }
}

/// A message charged before (a suspect: it failed, or its worker died) runs alone: when
/// it starts, no other handler runs and every finished job's ack has committed, and no
/// other handler starts until it has ended, so a suspect that kills its process can
/// charge only itself.
pub async fn a_suspect_runs_alone_after_every_finished_ack_has_committed(
    h: Arc<dyn Harness>,
) -> Result<()> {
    const BEFORE: usize = 80;
    const AFTER: usize = 40;
    const TOTAL: usize = BEFORE + 1 + AFTER;
    let (_store, t) = open(&h, Duration::from_secs(30)).await?;
    let q = fresh_queue();
    t.publish_batch((0..BEFORE).map(|_| job(&q, "fine")).collect())
        .await?;

    let running = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let suspect_running = Arc::new(AtomicBool::new(false));
    let suspect_done = Arc::new(AtomicBool::new(false));
    let started_beside_it = Arc::new(AtomicUsize::new(0));
    // At the suspect's start: (handlers running, jobs finished, messages left in the store).
    let seen_at_start: Arc<Mutex<Option<(usize, usize, u64)>>> = Arc::default();
    // At the first start after the suspect ended: (jobs finished, messages left).
    let seen_after: Arc<Mutex<Option<(usize, u64)>>> = Arc::default();
    let worker = {
        let (running, finished) = (running.clone(), finished.clone());
        let (suspect_running, beside) = (suspect_running.clone(), started_beside_it.clone());
        let (seen, t2, q2) = (seen_at_start.clone(), t.clone(), q.clone());
        let (suspect_done, seen_after) = (suspect_done.clone(), seen_after.clone());
        let checked_after = Arc::new(AtomicBool::new(false));
        Worker::new(t.clone(), q.clone(), fast().with_concurrency(4)).handle_any(handler_fn(
            move |ctx: JobContext| {
                let (running, finished) = (running.clone(), finished.clone());
                let (suspect_running, beside) = (suspect_running.clone(), beside.clone());
                let (seen, t2, q2) = (seen.clone(), t2.clone(), q2.clone());
                let (suspect_done, seen_after) = (suspect_done.clone(), seen_after.clone());
                let checked_after = checked_after.clone();
                async move {
                    let now_running = running.fetch_add(1, Ordering::SeqCst) + 1;
                    if ctx.envelope.kind == "suspect" {
                        suspect_running.store(true, Ordering::SeqCst);
                        let done = finished.load(Ordering::SeqCst);
                        let s = stats_of(t2.as_ref(), &q2)
                            .await
                            .map_err(|e| JobError::fail(e.to_string()))?;
                        if let Ok(mut slot) = seen.lock() {
                            *slot = Some((now_running, done, s.ready + s.delayed + s.reserved));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        suspect_running.store(false, Ordering::SeqCst);
                        suspect_done.store(true, Ordering::SeqCst);
                    } else {
                        if suspect_running.load(Ordering::SeqCst) {
                            beside.fetch_add(1, Ordering::SeqCst);
                        }
                        // The first job to start after the suspect ended: by then the
                        // suspect's ack, and every other finished job's, has committed
                        // (no job started after it can have finished yet).
                        if suspect_done.load(Ordering::SeqCst)
                            && !checked_after.swap(true, Ordering::SeqCst)
                        {
                            let done = finished.load(Ordering::SeqCst);
                            let s = stats_of(t2.as_ref(), &q2)
                                .await
                                .map_err(|e| JobError::fail(e.to_string()))?;
                            if let Ok(mut slot) = seen_after.lock() {
                                *slot = Some((done, s.ready + s.delayed + s.reserved));
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        ))
    };
    let draining = tokio::spawn(drain(worker));
    let deadline = Instant::now() + Duration::from_secs(30);
    while finished.load(Ordering::SeqCst) < 8 {
        assert!(Instant::now() < deadline, "the worker did not start");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A message its worker died on once, published amid the drain, and more behind it.
    let mut suspect = job(&q, "suspect");
    suspect.attempts = 1;
    let mut more = vec![suspect];
    more.extend((0..AFTER).map(|_| job(&q, "fine")));
    t.publish_batch(more).await?;
    let report = draining
        .await
        .map_err(|e| Error::InvalidInput(format!("the worker task failed: {e}")))??;
    assert_eq!(report.succeeded, TOTAL as u64, "{report:?}");
    let (running_then, done_then, left_then) = seen_at_start
        .lock()
        .expect("the record")
        .expect("the suspect ran");
    assert!(
        done_then > 0 && done_then < TOTAL - 1,
        "the suspect should start amid the other jobs ({done_then} had finished)"
    );
    assert_eq!(running_then, 1, "other handlers ran beside the suspect");
    assert_eq!(
        left_then,
        (TOTAL - done_then) as u64,
        "finished jobs were not all acknowledged when the suspect started ({done_then} finished)"
    );
    assert_eq!(
        started_beside_it.load(Ordering::SeqCst),
        0,
        "handlers started while the suspect ran"
    );
    let (done_after, left_after) = seen_after
        .lock()
        .expect("the record")
        .expect("a job ran after the suspect");
    // Acks of jobs that started beside this one may land meanwhile, so at most.
    assert!(
        left_after <= (TOTAL - done_after) as u64,
        "the suspect's ack had not committed when the next job started ({left_after} left, {done_after} finished)"
    );
    assert_nothing_left(t.as_ref(), &q).await
}
