//! Helpers of the worker cases: fresh queues, jobs, quick options, draining workers.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::harness::{Harness, OpenOptions};
use crate::worker::{handler_fn, JobContext, RetryPolicy, Worker, WorkerOptions};
use crate::{DeadLetter, Envelope, Error, QueueName, QueueStats, Result, Transport};
use tokio_util::sync::CancellationToken;

pub(super) fn fresh_queue() -> QueueName {
    QueueName::new(format!("w-{}", Uuid::new_v4().simple())).expect("a valid queue name")
}

pub(super) fn job(queue: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(queue.as_str(), kind)
        .build()
        .expect("a valid envelope")
}

/// Quick retries so the cases finish in seconds.
pub(super) fn fast() -> WorkerOptions {
    WorkerOptions::default()
        .with_retry(RetryPolicy::new(
            Duration::from_millis(20),
            Duration::from_millis(80),
            3,
        ))
        .with_poll(Duration::from_millis(5), Duration::from_millis(50))
        .with_drain(true)
}

pub(super) async fn open(
    h: &Arc<dyn Harness>,
    lease: Duration,
) -> Result<(Box<dyn super::harness::Store>, Arc<dyn Transport>)> {
    let store = h.store().await?;
    let t = store
        .open(OpenOptions {
            visibility_timeout: lease,
            ..OpenOptions::default()
        })
        .await?;
    Ok((store, t))
}

pub(super) async fn drain(worker: Worker) -> Result<crate::worker::WorkerReport> {
    tokio::time::timeout(
        Duration::from_secs(120),
        worker.run(CancellationToken::new()),
    )
    .await
    .map_err(|_| Error::InvalidInput("the worker did not drain within 120 s".into()))?
}

pub(super) async fn stats_of(t: &dyn Transport, q: &QueueName) -> Result<QueueStats> {
    Ok(t.stats(Some(q))
        .await?
        .into_iter()
        .find(|s| s.queue == q.as_str())
        .unwrap_or_else(|| QueueStats::new(q.as_str())))
}

/// Nothing ready, delayed, reserved or dead is left on `q`.
pub(super) async fn assert_nothing_left(t: &dyn Transport, q: &QueueName) -> Result<()> {
    let s = stats_of(t, q).await?;
    assert_eq!(
        (s.ready, s.delayed, s.reserved, s.dead),
        (0, 0, 0, 0),
        "left on {q}: {s:?}"
    );
    Ok(())
}

pub(super) async fn only_dead(t: &dyn Transport, q: &QueueName) -> Result<DeadLetter> {
    let mut dead = t.dead_list(Some(q), 10).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    Ok(dead.remove(0))
}

/// Drains `q` with a handler that only counts its calls; returns the count.
pub(super) async fn drain_counting(t: Arc<dyn Transport>, q: &QueueName) -> Result<usize> {
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
pub(super) type Calls = Arc<Mutex<Vec<(Uuid, u32, Instant)>>>;

pub(super) fn record(calls: &Calls, ctx: &JobContext) {
    calls
        .lock()
        .expect("calls lock")
        .push((ctx.envelope.id, ctx.attempt, Instant::now()));
}
