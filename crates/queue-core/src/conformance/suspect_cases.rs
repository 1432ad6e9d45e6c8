//! A message charged before runs alone, with nothing at stake.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::worker_support::{assert_nothing_left, drain, fast, fresh_queue, job, open, stats_of};
use super::Harness;
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{Error, Result};

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
