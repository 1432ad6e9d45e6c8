//! Job status as operators look at it: payloads, workers and failed attempts, job lists
//! with counts, and running workers. Run by [`status_tests!`](crate::status_tests).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::harness::Harness;
use super::status_support::{fresh_queue, job, open, options, spawn, until};
use crate::status::{JobState, JobStatus, Jobs, StatusUpdate};
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{Envelope, Result};

/// A job's record keeps its payload, the worker of its latest attempt and when that
/// attempt started; its failed attempts are kept apart, each with its error, worker
/// and times.
pub async fn status_keeps_payload_worker_and_failed_attempts(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let flaky = Envelope::builder(q.as_str(), "flaky")
        .payload(&json!({ "n": 7, "note": "ünïcode" }))
        .build()?;
    let doomed = job(&q, "doomed");
    let (flaky_id, doomed_id) = (flaky.id, doomed.id);
    let worker = Worker::for_jobs(&jobs, q.clone(), options(3))
        .handle(
            "flaky",
            handler_fn(|ctx: JobContext| async move {
                if ctx.attempt < 3 {
                    return Err(JobError::retry(format!("boom {}", ctx.attempt)));
                }
                ctx.set_result(&json!("third time"))?;
                Ok(())
            }),
        )
        .handle(
            "doomed",
            handler_fn(|_ctx: JobContext| async move { Err(JobError::fail("no such invoice")) }),
        );
    jobs.publish_batch(vec![flaky, doomed]).await?;
    let pending = o.status.get(flaky_id).await?.expect("recorded at publish");
    assert_eq!(pending.payload, Some(json!({ "n": 7, "note": "ünïcode" })));
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let done = until(o.status.as_ref(), flaky_id, "completed", |s| {
        s.state == JobState::Completed
    })
    .await?;
    let me = crate::status::worker_label();
    assert_eq!(done.attempts, 3);
    assert_eq!(done.payload, Some(json!({ "n": 7, "note": "ünïcode" })));
    assert_eq!(done.worker.as_deref(), Some(me.as_str()));
    let (started, finished) = (
        done.started_at.expect("the last attempt's start"),
        done.finished_at.expect("finished"),
    );
    assert!(started <= finished, "{started} after {finished}");
    let tries = o.status.attempts(flaky_id).await?;
    let summary: Vec<(u32, JobState, Option<&str>)> = tries
        .iter()
        .map(|t| (t.attempt, t.state, t.error.as_deref()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, JobState::Retrying, Some("boom 1")),
            (2, JobState::Retrying, Some("boom 2")),
        ]
    );
    for t in &tries {
        assert_eq!(t.worker.as_deref(), Some(me.as_str()));
        let start = t.started_at.expect("a failed attempt's start");
        // Each statement of a status batch reads the server's clock on its own (MySQL
        // writes the attempts after the job's final state): the attempt may end a few
        // microseconds after the job's recorded finish, never later than the batch.
        let slack = chrono::Duration::seconds(1);
        assert!(
            start <= t.ended_at && t.ended_at <= finished + slack,
            "{t:?}"
        );
    }
    let failed = until(o.status.as_ref(), doomed_id, "failed", |s| {
        s.state == JobState::Failed
    })
    .await?;
    assert_eq!(
        failed.payload,
        Some(json!(null)),
        "no payload given: JSON null"
    );
    let tries = o.status.attempts(doomed_id).await?;
    assert_eq!(tries.len(), 1, "{tries:?}");
    assert_eq!(
        (tries[0].attempt, tries[0].state, tries[0].error.as_deref()),
        (1, JobState::Failed, Some("no such invoice"))
    );
    stop.cancel();
    let _ = running.await;
    Ok(())
}

/// A replayed dead letter starts over: the attempts of its earlier run are gone with
/// its reset.
pub async fn a_reset_job_forgets_its_failed_attempts(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let e = job(&fresh_queue(), "k");
    o.status
        .record(&[
            StatusUpdate::running(&e, 1).by("host:1"),
            StatusUpdate::ended(&e, 1, JobState::Dead, Some("gone")),
        ])
        .await?;
    assert_eq!(o.status.attempts(e.id).await?.len(), 1);
    assert_eq!(o.status.reset(&[e.id]).await?, 1);
    assert!(o.status.attempts(e.id).await?.is_empty());
    let pending = o.status.get(e.id).await?.expect("the record");
    assert_eq!(pending.state, JobState::Pending);
    assert_eq!(
        (pending.worker, pending.started_at),
        (None, None),
        "no attempt runs now"
    );
    Ok(())
}

/// Jobs are listed by queue and state, newest change first, a page at a time, and
/// found by the start of their id or by their kind; counts per queue and state.
pub async fn jobs_are_listed_by_queue_state_and_search_with_counts(
    h: Arc<dyn Harness>,
) -> Result<()> {
    use crate::status::JobFilter;
    let o = open(&h).await?;
    let (q, other) = (fresh_queue(), fresh_queue());
    let done: Vec<Envelope> = (0..3).map(|_| job(&q, "invoice")).collect();
    let dead: Vec<Envelope> = (0..2).map(|_| job(&q, "refund")).collect();
    let waiting = job(&q, "invoice");
    let elsewhere = job(&other, "invoice");
    let mut updates = vec![
        StatusUpdate::published(&waiting),
        StatusUpdate::published(&elsewhere),
    ];
    for e in &done {
        updates.push(StatusUpdate::running(e, 1));
        updates.push(StatusUpdate::completed(e, 1, None));
    }
    for e in &dead {
        updates.push(StatusUpdate::ended(e, 1, JobState::Dead, Some("x")));
    }
    o.status.record(&updates).await?;

    let ids = |list: Vec<JobStatus>| -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = list.into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    let sorted = |es: &[Envelope]| -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = es.iter().map(|e| e.id).collect();
        ids.sort();
        ids
    };
    let completed = JobFilter::new(10)
        .queue(q.as_str())
        .state(JobState::Completed);
    assert_eq!(ids(o.status.list(&completed).await?), sorted(&done));
    let all_of_q = JobFilter::new(10).queue(q.as_str());
    assert_eq!(o.status.list(&all_of_q).await?.len(), 6);
    // Pages cover the list once.
    let mut paged = Vec::new();
    for page in 0..3 {
        let filter = JobFilter::new(2).queue(q.as_str()).offset(page * 2);
        paged.extend(o.status.list(&filter).await?);
    }
    let mut expected = sorted(&done);
    expected.extend(sorted(&dead));
    expected.push(waiting.id);
    expected.sort();
    assert_eq!(ids(paged), expected);
    // By the start of an id (ids made in the same millisecond share their first
    // groups), in either case; by kind.
    let prefix = waiting.id.to_string()[..30].to_ascii_uppercase();
    let found = o
        .status
        .list(&JobFilter::new(10).queue(q.as_str()).search(prefix))
        .await?;
    assert_eq!(ids(found), vec![waiting.id]);
    let refunds = o
        .status
        .list(&JobFilter::new(10).queue(q.as_str()).search("refund"))
        .await?;
    assert_eq!(ids(refunds), sorted(&dead));
    assert!(o
        .status
        .list(&JobFilter::new(10).queue(q.as_str()).search("%"))
        .await?
        .is_empty());

    let counts: Vec<(JobState, u64)> = o
        .status
        .counts()
        .await?
        .into_iter()
        .filter(|c| c.queue == q.as_str())
        .map(|c| (c.state, c.count))
        .collect();
    for want in [
        (JobState::Pending, 1),
        (JobState::Completed, 3),
        (JobState::Dead, 2),
    ] {
        assert!(counts.contains(&want), "{want:?} not in {counts:?}");
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    Ok(())
}

/// Workers report themselves: registered as they start, their heartbeat counting the
/// jobs they did, and gone as they stop.
pub async fn workers_report_themselves_and_leave(h: Arc<dyn Harness>) -> Result<()> {
    use crate::status::WorkerInfo;
    let o = open(&h).await?;
    let q = fresh_queue();
    let info = WorkerInfo::this_process(q.as_str(), 3);
    o.status.register_worker(&info).await?;
    let listed = o.status.workers().await?;
    let me = listed
        .iter()
        .find(|w| w.id == info.id)
        .unwrap_or_else(|| panic!("{info:?} not in {listed:?}"));
    assert_eq!(
        (
            me.host.as_str(),
            me.pid,
            me.queue.as_str(),
            me.concurrency,
            me.jobs_done
        ),
        (info.host.as_str(), std::process::id(), q.as_str(), 3, 0)
    );
    assert!(o.status.worker_heartbeat(info.id, 5).await?);
    let listed = o.status.workers().await?;
    assert_eq!(
        listed.iter().find(|w| w.id == info.id).map(|w| w.jobs_done),
        Some(5)
    );
    o.status.worker_stopped(info.id).await?;
    assert!(!o.status.workers().await?.iter().any(|w| w.id == info.id));
    assert!(
        !o.status.worker_heartbeat(info.id, 6).await?,
        "a forgotten worker"
    );

    // A running worker does it by itself.
    let worker = Worker::new(o.transport.clone(), q.clone(), options(1))
        .with_status(o.status.clone())
        .handle_any(handler_fn(|_ctx: JobContext| async move { Ok(()) }));
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let here = o.status.workers().await?;
        if here
            .iter()
            .any(|w| w.queue == q.as_str() && w.pid == std::process::id())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never showed: {here:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let _ = running.await;
    let left = o.status.workers().await?;
    assert!(
        !left.iter().any(|w| w.queue == q.as_str()),
        "a stopped worker is still listed: {left:?}"
    );
    Ok(())
}

/// A worker still finishing its jobs after shutdown was asked for keeps beating, so that
/// it stays listed through its grace period instead of looking gone.
pub async fn a_worker_beats_through_its_grace_period(h: Arc<dyn Harness>) -> Result<()> {
    use crate::status::HEARTBEAT_EVERY;
    use crate::TransportExt;
    let o = open(&h).await?;
    let q = fresh_queue();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let slow = HEARTBEAT_EVERY + Duration::from_secs(2);
    let worker = Worker::new(
        o.transport.clone(),
        q.clone(),
        options(1).with_grace_period(slow + Duration::from_secs(10)),
    )
    .with_status(o.status.clone())
    .handle_any(handler_fn(move |_ctx: JobContext| {
        let started = started_tx.clone();
        async move {
            let _ = started.send(());
            // Deaf to shutdown: it ends in its own time, inside the grace period.
            tokio::time::sleep(slow).await;
            Ok(())
        }
    }));
    o.transport.publish(job(&q, "slow")).await?;
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    tokio::time::timeout(Duration::from_secs(10), started_rx.recv())
        .await
        .map_err(|_| crate::Error::InvalidInput("the job never started".into()))?;
    let listed = |workers: Vec<crate::status::WorkerInfo>| {
        workers.into_iter().find(|w| w.queue == q.as_str())
    };
    // Taken after the stop: a beat between this and a stop would prove nothing.
    stop.cancel();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(w) = listed(o.status.workers().await?) {
            break w;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the running worker was never listed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let deadline = tokio::time::Instant::now() + HEARTBEAT_EVERY + Duration::from_millis(1500);
    let later = loop {
        let now = listed(o.status.workers().await?);
        if let Some(w) = now.as_ref().filter(|w| w.heartbeat_at > first.heartbeat_at) {
            break w.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeat since shutdown began: first {first:?}, now {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(later.id, first.id);
    assert!(
        !running.is_finished(),
        "the run ended before its handler did"
    );
    running
        .await
        .map_err(|e| crate::Error::InvalidInput(format!("the worker panicked: {e}")))?;
    assert!(
        listed(o.status.workers().await?).is_none(),
        "a stopped worker is still listed"
    );
    Ok(())
}
