//! Cases of an operator's controls: a paused queue or kind is not started until
//! resumed, a cancelled job never runs, and a running one's handler is cancelled; both
//! end `cancelled`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::harness::{open_beside, Beside, Harness};
use super::worker_support::{drain, fast, fresh_queue};
use crate::controls::Controls;
use crate::status::{JobState, Jobs};
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{DeadSelection, Envelope, Error, QueueName, Result, TransportExt};

/// A fresh store's transport, status store and controls, or `None` (said why) where the
/// backend keeps no controls (RabbitMQ without a control store).
async fn open_controlled(h: &Arc<dyn Harness>) -> Result<Option<Beside<dyn Controls>>> {
    open_beside(h, |s, _| s?.controls(), "no store beside it keeps controls").await
}

fn job(q: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(q.as_str(), kind)
        .build()
        .expect("a valid envelope")
}

/// Runs until `cond` holds, or fails after `within`.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    while !cond() {
        if Instant::now() > deadline {
            return Err(Error::InvalidInput(format!(
                "{what} did not happen within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A paused queue is not claimed and a paused kind not run until resumed; then every
/// job runs, on its first attempt.
pub async fn pausing_stops_starts_until_resumed(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, controls)) = open_controlled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    controls.pause(q.as_str(), None).await?;
    controls.pause(q.as_str(), Some("later")).await?;
    let paused = controls.paused().await?;
    assert!(paused
        .iter()
        .any(|p| p.queue == q.as_str() && p.kind.is_none()));
    t.publish_batch(vec![job(&q, "now"), job(&q, "now"), job(&q, "later")])
        .await?;
    let runs: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let r = runs.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast().with_drain(false))
        .with_status(status)
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut r) = r.lock() {
                r.push((ctx.envelope.kind.clone(), ctx.attempt));
            }
            async { Ok(()) }
        }));
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let count = |runs: &Arc<Mutex<Vec<(String, u32)>>>| runs.lock().map(|r| r.len()).unwrap_or(0);
    assert_eq!(count(&runs), 0, "a paused queue's job ran");
    assert!(controls.resume(q.as_str(), None).await?);
    until(
        Duration::from_secs(10),
        "the resumed queue's jobs running",
        || count(&runs) == 2,
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(count(&runs), 2, "a paused kind's job ran");
    assert!(controls.resume(q.as_str(), Some("later")).await?);
    assert!(
        !controls.resume(q.as_str(), Some("later")).await?,
        "resumed twice"
    );
    until(
        Duration::from_secs(10),
        "the resumed kind's job running",
        || count(&runs) == 3,
    )
    .await?;
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("the worker panicked: {e}")))??;
    let runs = runs.lock().expect("the runs").clone();
    assert!(
        runs.iter().all(|(_, a)| *a == 1),
        "a pause counted an attempt: {runs:?}"
    );
    Ok(())
}

/// A job cancelled before a worker reaches it never runs; a running one's handler sees
/// its cancellation within a second; both end `cancelled`, their messages gone and
/// their marks forgotten.
pub async fn cancelled_jobs_never_run_or_are_stopped(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, controls)) = open_controlled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let (waiting, long) = (job(&q, "waiting"), job(&q, "long"));
    t.publish(waiting.clone()).await?;
    controls.cancel(&[waiting.id]).await?;
    t.publish(long.clone()).await?;
    let ran: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (r, s) = (ran.clone(), stopped.clone());
    let worker = Worker::new(t.clone(), q.clone(), fast().with_drain(false))
        .with_status(status.clone())
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut r) = r.lock() {
                r.push(ctx.envelope.id);
            }
            let s = s.clone();
            async move {
                ctx.cancel.cancelled().await;
                if let Ok(mut s) = s.lock() {
                    *s = Some(Instant::now());
                }
                Ok(())
            }
        }));
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    until(Duration::from_secs(10), "the long job starting", || {
        ran.lock().map(|r| r.contains(&long.id)).unwrap_or(false)
    })
    .await?;
    let asked = Instant::now();
    controls.cancel(&[long.id]).await?;
    until(
        Duration::from_secs(5),
        "the running handler's cancellation",
        || stopped.lock().map(|s| s.is_some()).unwrap_or(false),
    )
    .await?;
    let took = stopped
        .lock()
        .ok()
        .and_then(|s| *s)
        .map(|at| at.duration_since(asked))
        .unwrap_or_default();
    assert!(
        took < Duration::from_secs(2),
        "cancelled {took:?} after the ask"
    );
    let ended = |id| {
        let status = status.clone();
        async move {
            Ok::<_, Error>(
                status
                    .get(id)
                    .await?
                    .is_some_and(|s| s.state == JobState::Cancelled),
            )
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(ended(waiting.id).await? && ended(long.id).await?) {
        assert!(Instant::now() < deadline, "the jobs did not end cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("the worker panicked: {e}")))??;
    assert_eq!(
        ran.lock().expect("the runs").clone(),
        vec![long.id],
        "the job cancelled while waiting ran"
    );
    let stats = t.stats(Some(&q)).await?;
    assert!(
        stats.iter().all(|s| s.ready + s.reserved == 0),
        "a cancelled job's message stayed: {stats:?}"
    );
    let marks = controls.cancelled().await?;
    assert!(
        !marks.contains(&waiting.id) && !marks.contains(&long.id),
        "an ended job's cancellation mark stayed"
    );
    Ok(())
}

/// A cancellation made as a job ended (its worker never saw it) cancels no later run of
/// the job: a replay by id, a bulk replay and a publish under its id each run it, and
/// the marks are forgotten.
pub async fn a_mark_left_by_an_ended_run_cancels_no_later_run(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, controls)) = open_controlled(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let jobs = Jobs::new(t.clone(), Some(status.clone()));
    let (by_id, in_bulk, again) = (job(&q, "doomed"), job(&q, "doomed"), job(&q, "done"));
    let ids = [by_id.id, in_bulk.id, again.id];
    jobs.publish_batch(vec![by_id.clone(), in_bulk.clone(), again.clone()])
        .await?;
    let first = Worker::new(t.clone(), q.clone(), fast())
        .with_status(status.clone())
        .handle_any(handler_fn(|ctx: JobContext| async move {
            match ctx.envelope.kind.as_str() {
                "doomed" => Err(JobError::fail("doomed on its first run")),
                _ => Ok(()),
            }
        }));
    drain(first).await?;
    for id in ids {
        let recorded = status.get(id).await?.map(|s| s.state);
        assert!(
            recorded.is_some_and(JobState::is_final),
            "the first run of {id}: {recorded:?}"
        );
    }
    // Marked just as they ended: no worker saw the marks.
    controls.cancel(&ids).await?;
    // A worker already running, whose view holds the marks when the jobs come back.
    let ran: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let r = ran.clone();
    let second = Worker::new(t.clone(), q.clone(), fast().with_drain(false))
        .with_status(status.clone())
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut r) = r.lock() {
                r.push(ctx.envelope.id);
            }
            async { Ok(()) }
        }));
    let stop = CancellationToken::new();
    let running = tokio::spawn(second.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replayed = jobs
        .replay_dead(Some(&q), &DeadSelection::Id(by_id.id.to_string()))
        .await?;
    assert_eq!(replayed, 1);
    assert_eq!(jobs.replay_dead(Some(&q), &DeadSelection::All).await?, 1);
    jobs.publish(again.clone()).await?;
    let ended = |id| {
        let status = status.clone();
        async move { Ok::<_, Error>(status.get(id).await?.map(|s| s.state)) }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut states = Vec::new();
        for id in ids {
            states.push(ended(id).await?);
        }
        let settled = states
            .iter()
            .all(|s| matches!(s, Some(JobState::Completed | JobState::Cancelled)));
        let rerun = ran.lock().map(|r| r.len()).unwrap_or(0);
        if settled
            && rerun
                + states
                    .iter()
                    .filter(|s| **s == Some(JobState::Cancelled))
                    .count()
                == 3
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the later runs did not end: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("the worker panicked: {e}")))??;
    let mut ran = ran.lock().expect("the runs").clone();
    ran.sort();
    let mut all = ids.to_vec();
    all.sort();
    assert_eq!(
        ran, all,
        "a stale mark cancelled a later run (by id {}, in bulk {}, again {})",
        by_id.id, in_bulk.id, again.id
    );
    for id in ids {
        let recorded = status.get(id).await?.map(|s| s.state);
        assert_eq!(
            recorded,
            Some(JobState::Completed),
            "the second run of {id}"
        );
    }
    let marks = controls.cancelled().await?;
    assert!(
        ids.iter().all(|id| !marks.contains(id)),
        "a stale mark stayed: {marks:?}"
    );
    Ok(())
}
