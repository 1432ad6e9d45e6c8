//! The worker's shutdown: quick jobs finish, the rest go back, and it is prompt; a run
//! whose future is dropped stops its handlers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::harness::Harness;
use super::worker_support::{assert_nothing_left, drain, fast, fresh_queue, job, open};
use crate::worker::{handler_fn, JobContext, Worker};
use crate::{Error, Result, TransportExt};

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

/// A worker's run whose future is dropped (a timeout around it, a `select!` that took
/// another branch) takes its handlers with it: nothing would renew their leases, so
/// another worker could start the same jobs while they ran on.
pub async fn a_dropped_run_stops_its_handlers(h: Arc<dyn Harness>) -> Result<()> {
    let (_store, t) = open(&h, Duration::from_secs(60)).await?;
    let q = fresh_queue();
    t.publish(job(&q, "endless")).await?;
    let ticks = Arc::new(AtomicUsize::new(0));
    let gone = CancellationToken::new();
    let (counted, dropped) = (ticks.clone(), gone.clone());
    let worker = Worker::new(t.clone(), q, fast().with_drain(false)).handle(
        "endless",
        handler_fn(move |ctx: JobContext| {
            let ticks = counted.clone();
            // Cancelled as the handler's future is dropped: its task was aborted.
            let aborted = dropped.clone().drop_guard();
            async move {
                let _aborted = aborted;
                // Deaf to shutdown: only a cancel or an abort ends it.
                while !ctx.cancel.is_cancelled() {
                    ticks.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(())
            }
        }),
    );
    let stop = CancellationToken::new();
    // Boxed, so that dropping it drops the run itself.
    let mut run = Box::pin(worker.run(stop.clone()));
    let started = Instant::now();
    while ticks.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the handler never started"
        );
        tokio::select! {
            ended = &mut run => panic!("the run ended by itself: {ended:?}"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    drop(run);
    let aborted = tokio::time::timeout(Duration::from_secs(5), gone.cancelled()).await;
    assert!(
        aborted.is_ok(),
        "the handler ran on after its run was dropped"
    );
    let after_drop = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        after_drop,
        "the handler's loop went on after its future was dropped"
    );
    assert!(!stop.is_cancelled(), "the caller's token is the caller's");
    Ok(())
}
