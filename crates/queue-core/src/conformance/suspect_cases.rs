//! A message charged before runs alone, with nothing at stake.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::harness::Harness;
use super::worker_support::{assert_nothing_left, drain, fast, fresh_queue, job, open, stats_of};
use crate::names::QueueName;
use crate::transport::Transport;
use crate::worker::{handler_fn, JobContext, JobError, JobResult, Worker};
use crate::{Error, Result};

/// What the handlers of the suspect case saw.
#[derive(Debug, Default)]
struct Watch {
    running: AtomicUsize,
    finished: AtomicUsize,
    suspect_running: AtomicBool,
    suspect_done: AtomicBool,
    started_beside_it: AtomicUsize,
    checked_after: AtomicBool,
    /// At the suspect's start: (handlers running, jobs finished, messages left in the
    /// store).
    seen_at_start: Mutex<Option<(usize, usize, u64)>>,
    /// At the first start after the suspect ended: (jobs finished, messages left).
    seen_after: Mutex<Option<(usize, u64)>>,
}

impl Watch {
    /// The handler of every job: the suspect records what it finds at its start; the
    /// first job after it records what it finds then.
    async fn handle(&self, ctx: JobContext, t: &dyn Transport, q: &QueueName) -> JobResult {
        let left = || async {
            let s = stats_of(t, q)
                .await
                .map_err(|e| JobError::fail(e.to_string()))?;
            Ok::<u64, JobError>(s.ready + s.delayed + s.reserved)
        };
        let now_running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        if ctx.envelope.kind == "suspect" {
            self.suspect_running.store(true, Ordering::SeqCst);
            let done = self.finished.load(Ordering::SeqCst);
            let left = left().await?;
            if let Ok(mut slot) = self.seen_at_start.lock() {
                *slot = Some((now_running, done, left));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.suspect_running.store(false, Ordering::SeqCst);
            self.suspect_done.store(true, Ordering::SeqCst);
        } else {
            if self.suspect_running.load(Ordering::SeqCst) {
                self.started_beside_it.fetch_add(1, Ordering::SeqCst);
            }
            // The first job to start after the suspect ended: by then the suspect's ack,
            // and every other finished job's, has committed (no job started after it can
            // have finished yet).
            if self.suspect_done.load(Ordering::SeqCst)
                && !self.checked_after.swap(true, Ordering::SeqCst)
            {
                let done = self.finished.load(Ordering::SeqCst);
                let left = left().await?;
                if let Ok(mut slot) = self.seen_after.lock() {
                    *slot = Some((done, left));
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The suspect ran alone, after every finished job's ack, and its own ack
    /// committed before the next job started.
    fn assert_alone(&self, total: usize) {
        let (running_then, done_then, left_then) = self
            .seen_at_start
            .lock()
            .expect("the record")
            .expect("the suspect ran");
        assert!(
            done_then > 0 && done_then < total - 1,
            "the suspect should start amid the other jobs ({done_then} had finished)"
        );
        assert_eq!(running_then, 1, "other handlers ran beside the suspect");
        assert_eq!(
            left_then,
            (total - done_then) as u64,
            "finished jobs were not all acknowledged when the suspect started ({done_then} finished)"
        );
        assert_eq!(
            self.started_beside_it.load(Ordering::SeqCst),
            0,
            "handlers started while the suspect ran"
        );
        let (done_after, left_after) = self
            .seen_after
            .lock()
            .expect("the record")
            .expect("a job ran after the suspect");
        // Acks of jobs that started beside this one may land meanwhile, so at most.
        assert!(
            left_after <= (total - done_after) as u64,
            "the suspect's ack had not committed when the next job started ({left_after} left, {done_after} finished)"
        );
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
    let watch = Arc::new(Watch::default());
    let worker = {
        let (watch, t2, q2) = (watch.clone(), t.clone(), q.clone());
        Worker::new(t.clone(), q.clone(), fast().with_concurrency(4)).handle_any(handler_fn(
            move |ctx: JobContext| {
                let (watch, t2, q2) = (watch.clone(), t2.clone(), q2.clone());
                async move { watch.handle(ctx, t2.as_ref(), &q2).await }
            },
        ))
    };
    let draining = tokio::spawn(drain(worker));
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch.finished.load(Ordering::SeqCst) < 8 {
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
    watch.assert_alone(TOTAL);
    assert_nothing_left(t.as_ref(), &q).await
}
