//! Job status, progress, results and request/reply, checked against a transport's
//! status store. Run by [`status_tests!`](crate::status_tests).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::harness::Harness;
use super::status_support::{fresh_queue, job, open, options, spawn, until};
pub use super::status_view_cases::*;
use crate::status::{next_change, JobState, JobStatus, Jobs, StatusUpdate, WaitError};
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{DeadSelection, Envelope, Error, Result};

/// pending → running (with progress) → completed, with the result recorded once acked.
pub async fn status_walks_pending_running_completed(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let e = job(&q, "report");
    let id = e.id;
    jobs.publish(e).await?;
    let s = until(o.status.as_ref(), id, "pending", |_| true).await?;
    assert_eq!(s.state, JobState::Pending);
    assert_eq!((s.attempts, s.progress, s.version), (0, 0, 1));
    assert_eq!((s.queue.as_str(), s.kind.as_str()), (q.as_str(), "report"));
    assert!(s.finished_at.is_none() && s.result.is_none());

    let go_on = Arc::new(Notify::new());
    let gate = go_on.clone();
    let worker = Worker::new(o.transport.clone(), q.clone(), options(3))
        .with_status(o.status.clone())
        .handle(
            "report",
            handler_fn(move |ctx: JobContext| {
                let gate = gate.clone();
                async move {
                    ctx.progress(40, "rendering");
                    gate.notified().await;
                    ctx.set_result(&json!({"pages": 12}))?;
                    Ok(())
                }
            }),
        );
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let s = until(o.status.as_ref(), id, "running at 40%", |s| {
        s.state == JobState::Running && s.progress == 40
    })
    .await?;
    assert_eq!(s.attempts, 1);
    assert_eq!(s.progress_message.as_deref(), Some("rendering"));
    assert!(s.version > 1);
    go_on.notify_one();
    let s = until(o.status.as_ref(), id, "completed", |s| {
        s.state == JobState::Completed
    })
    .await?;
    assert_eq!(s.result, Some(json!({"pages": 12})));
    assert_eq!(s.progress, 100);
    assert!(s.finished_at.is_some());
    assert!(s.updated_at >= s.created_at);
    stop.cancel();
    let _ = running.await;
    Ok(())
}

/// A batch of more updates than one statement holds is written whole: 1,200 records
/// created in one `record`, then each completed with its own result in another (SQLite
/// binds 14 parameters a row, 500 rows a statement).
pub async fn status_batches_larger_than_a_statement_are_written_whole(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let envs: Vec<Envelope> = (0..1_200).map(|_| job(&q, "bulk")).collect();
    let created: Vec<StatusUpdate> = envs.iter().map(StatusUpdate::published).collect();
    o.status.record(&created).await?;
    let done: Vec<StatusUpdate> = envs
        .iter()
        .enumerate()
        .map(|(i, e)| StatusUpdate::completed(e, 1, Some(json!({ "i": i }))))
        .collect();
    o.status.record(&done).await?;
    for (i, e) in envs.iter().enumerate() {
        let s = o.status.get(e.id).await?;
        let s = s.unwrap_or_else(|| panic!("no status for update {i} of 1,200"));
        assert_eq!(
            (s.state, s.attempts, s.result),
            (JobState::Completed, 1, Some(json!({ "i": i }))),
            "update {i} of 1,200"
        );
    }
    Ok(())
}

/// running → retrying (with the error) → running → dead once the attempts run out; and a
/// handler that gives up is `failed` at once.
pub async fn status_records_retrying_dead_and_failed(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let flaky = job(&q, "flaky");
    let doomed = job(&q, "doomed");
    let (flaky_id, doomed_id) = (flaky.id, doomed.id);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let status = o.status.clone();
    let worker = Worker::new(o.transport.clone(), q.clone(), options(2))
        .with_status(o.status.clone())
        .handle(
            "flaky",
            handler_fn(move |ctx: JobContext| {
                let (log, status) = (log.clone(), status.clone());
                async move {
                    // What the previous attempt left recorded, seen from the next one.
                    if ctx.attempt == 2 {
                        let before = until(status.as_ref(), ctx.envelope.id, "running", |s| {
                            s.state == JobState::Running && s.attempts == 2
                        })
                        .await
                        .map_err(|e| JobError::fail(e.to_string()))?;
                        if let Ok(mut log) = log.lock() {
                            log.push(before);
                        }
                    }
                    Err(JobError::retry(format!("boom {}", ctx.attempt)))
                }
            }),
        )
        .handle(
            "doomed",
            handler_fn(
                |_ctx: JobContext| async move { Err(JobError::fail("the invoice was deleted")) },
            ),
        );
    jobs.publish_batch(vec![flaky, doomed]).await?;
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let s = until(o.status.as_ref(), flaky_id, "retrying", |s| {
        s.state == JobState::Retrying || s.state == JobState::Dead
    })
    .await?;
    if s.state == JobState::Retrying {
        assert_eq!(s.attempts, 1);
        assert_eq!(s.last_error.as_deref(), Some("boom 1"));
        assert!(s.finished_at.is_none());
    }
    let s = until(o.status.as_ref(), flaky_id, "dead", |s| {
        s.state == JobState::Dead
    })
    .await?;
    assert_eq!(s.attempts, 2);
    assert_eq!(s.last_error.as_deref(), Some("boom 2"));
    assert!(s.finished_at.is_some() && s.result.is_none());
    let second = seen.lock().map(|v| v.clone()).unwrap_or_default();
    assert_eq!(second.len(), 1, "the second attempt ran once");
    // Running again, the first attempt's error still shown.
    assert_eq!(second[0].last_error.as_deref(), Some("boom 1"));

    let s = until(o.status.as_ref(), doomed_id, "failed", |s| {
        s.state == JobState::Failed
    })
    .await?;
    assert_eq!(s.attempts, 1);
    assert_eq!(s.last_error.as_deref(), Some("the invoice was deleted"));
    stop.cancel();
    let _ = running.await;
    Ok(())
}

/// A replayed dead letter is `pending` again, and its new deliveries, counted from 1,
/// are recorded over the old `dead`.
pub async fn status_of_a_replayed_dead_letter_starts_over(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let e = job(&q, "flaky");
    let id = e.id;
    jobs.publish(e).await?;
    let fails = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let failing = fails.clone();
    let worker = Worker::new(o.transport.clone(), q.clone(), options(1))
        .with_status(o.status.clone())
        .handle(
            "flaky",
            handler_fn(move |ctx: JobContext| {
                let failing = failing.clone();
                async move {
                    if failing.load(std::sync::atomic::Ordering::SeqCst) {
                        return Err(JobError::retry("down"));
                    }
                    ctx.set_result("fixed")?;
                    Ok(())
                }
            }),
        );
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    until(o.status.as_ref(), id, "dead", |s| s.state == JobState::Dead).await?;
    fails.store(false, std::sync::atomic::Ordering::SeqCst);
    let replayed = o
        .transport
        .dead_replay(Some(&q), &DeadSelection::Id(id.to_string()))
        .await?;
    assert_eq!(replayed, 1);
    o.status.reset(&[id]).await?;
    let s = until(o.status.as_ref(), id, "completed after the replay", |s| {
        s.state != JobState::Dead
    })
    .await?;
    assert!(
        matches!(
            s.state,
            JobState::Pending | JobState::Running | JobState::Completed
        ),
        "{s:?}"
    );
    let s = until(o.status.as_ref(), id, "completed", |s| {
        s.state == JobState::Completed
    })
    .await?;
    assert_eq!(s.attempts, 1);
    assert_eq!(s.result, Some(json!("fixed")));
    stop.cancel();
    let _ = running.await;
    Ok(())
}

/// pending → dead without running (no handler for its kind), and running → pending
/// when the worker shuts down before the job finished (released for another worker).
pub async fn status_of_unhandled_and_released_jobs(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let stranger = job(&q, "unknown");
    let slow = job(&q, "slow");
    let (stranger_id, slow_id) = (stranger.id, slow.id);
    jobs.publish_batch(vec![stranger, slow]).await?;
    let worker = Worker::new(
        o.transport.clone(),
        q.clone(),
        options(3).with_grace_period(Duration::from_millis(50)),
    )
    .with_status(o.status.clone())
    .handle(
        "slow",
        handler_fn(|ctx: JobContext| async move {
            ctx.cancel.cancelled().await;
            Err(JobError::retry("stopped"))
        }),
    );
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let s = until(o.status.as_ref(), stranger_id, "dead", |s| {
        s.state == JobState::Dead
    })
    .await?;
    assert_eq!(s.attempts, 0, "never ran");
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no handler")),
        "{s:?}"
    );
    until(o.status.as_ref(), slow_id, "running", |s| {
        s.state == JobState::Running
    })
    .await?;
    stop.cancel();
    let _ = running.await;
    let s = o.status.get(slow_id).await?.expect("the record");
    assert_eq!((s.state, s.attempts), (JobState::Pending, 1), "{s:?}");
    assert!(s.finished_at.is_none());
    Ok(())
}

/// An update of an older attempt (a worker that lost its lease) never overwrites a newer
/// one, nor does anything of the same attempt overwrite a final state; publishing a
/// known id again changes nothing until its first start; only a failed or dead job is
/// reset; every applied change bumps the version.
pub async fn stale_status_updates_are_fenced(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let e = job(&q, "k");
    let st = o.status.as_ref();
    st.record(&[StatusUpdate::published(&e)]).await?;
    st.record(&[StatusUpdate::running(&e, 2)]).await?;
    st.record(&[
        StatusUpdate::completed(&e, 1, Some(json!("stale"))),
        StatusUpdate::published(&e),
    ])
    .await?;
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!((s.state, s.attempts, s.version), (JobState::Running, 2, 2));
    assert_eq!(s.result, None);
    // Several changes of one id in one batch apply in order.
    st.record(&[
        StatusUpdate::progress(&e, 2, 50, Some("half".into())),
        StatusUpdate::progress(&e, 2, 150, None),
    ])
    .await?;
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!((s.state, s.progress), (JobState::Running, 100));
    assert_eq!(st.get(Uuid::new_v4()).await?, None);

    // A final state stands against its own attempt: a stray progress report, a stale
    // retry, a reset of a job that is not dead.
    st.record(&[StatusUpdate::ended(&e, 3, JobState::Dead, Some("gone"))])
        .await?;
    st.record(&[StatusUpdate::progress(&e, 3, 10, Some("late".into()))])
        .await?;
    st.record(&[StatusUpdate::progress(&e, 1, 0, None)]).await?;
    st.record(&[StatusUpdate::ended(&e, 2, JobState::Retrying, Some("old"))])
        .await?;
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!((s.state, s.attempts), (JobState::Dead, 3), "{s:?}");
    assert_eq!(s.last_error.as_deref(), Some("gone"));
    // A later attempt does replace it (a duplicate delivery after a lost lease).
    st.record(&[StatusUpdate::running(&e, 4)]).await?;
    st.record(&[StatusUpdate::completed(&e, 4, Some(json!(1)))])
        .await?;
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!((s.state, s.attempts), (JobState::Completed, 4));
    assert_eq!(st.reset(&[e.id]).await?, 0, "a completed job is not reset");
    // The id published again after it completed: its first start counts from 1.
    st.record(&[StatusUpdate::running(&e, 1)]).await?;
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!(
        (s.state, s.attempts, s.result),
        (JobState::Running, 1, None)
    );
    // Replayed after dying: reset to pending, then its new start.
    st.record(&[StatusUpdate::ended(&e, 1, JobState::Failed, Some("no"))])
        .await?;
    assert_eq!(st.reset(&[e.id, Uuid::new_v4()]).await?, 1);
    let s = st.get(e.id).await?.expect("the record");
    assert_eq!(
        (s.state, s.attempts, s.finished_at),
        (JobState::Pending, 0, None)
    );

    // Long errors keep their end; NULs are replaced (PostgreSQL refuses them).
    let long = format!("{}\0the cause", "x".repeat(20_000));
    st.record(&[StatusUpdate::ended(&e, 1, JobState::Dead, Some(&long))])
        .await?;
    let s = st.get(e.id).await?.expect("the record");
    let kept = s.last_error.unwrap_or_default();
    assert!(
        kept.len() < 9_000 && kept.ends_with("x\u{fffd}the cause"),
        "{}",
        kept.len()
    );
    Ok(())
}

/// `publish_and_wait` returns the handler's result, the failure, or a timeout.
pub async fn publish_and_wait_returns_result_failure_or_timeout(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let worker = Worker::new(o.transport.clone(), q.clone(), options(2))
        .with_status(o.status.clone())
        .handle(
            "add",
            handler_fn(|ctx: JobContext| async move {
                let [a, b]: [i64; 2] = ctx.payload().map_err(|e| JobError::fail(e.to_string()))?;
                ctx.set_result(&json!({"sum": a + b}))?;
                Ok(())
            }),
        )
        .handle(
            "refuse",
            handler_fn(|_ctx: JobContext| async move { Err(JobError::fail("refused")) }),
        );
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let add = Envelope::builder(q.as_str(), "add")
        .payload(&[2, 3])
        .build()?;
    let first_id = add.id;
    let answer = jobs
        .publish_and_wait(add, Duration::from_secs(20))
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    assert_eq!(answer, json!({"sum": 5}));
    // The same id again, once the first is done: the answer is the new run's.
    let again = Envelope::builder(q.as_str(), "add")
        .id(first_id)
        .payload(&[10, 20])
        .build()?;
    let answer = jobs
        .publish_and_wait(again, Duration::from_secs(20))
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    assert_eq!(answer, json!({"sum": 30}));

    let refused = job(&q, "refuse");
    let refused_id = refused.id;
    match jobs
        .publish_and_wait(refused, Duration::from_secs(20))
        .await
    {
        Err(WaitError::Failed(s)) => {
            assert_eq!(s.id, refused_id);
            assert_eq!(s.state, JobState::Failed);
            assert_eq!(s.last_error.as_deref(), Some("refused"));
        }
        other => panic!("expected the failure, got {other:?}"),
    }

    // Nobody works this queue.
    let idle = job(&fresh_queue(), "add");
    let started = std::time::Instant::now();
    match jobs
        .publish_and_wait(idle, Duration::from_millis(300))
        .await
    {
        Err(WaitError::TimedOut { last, timeout, .. }) => {
            assert_eq!(timeout, Duration::from_millis(300));
            assert_eq!(last.map(|s| s.state), Some(JobState::Pending));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    stop.cancel();
    let _ = running.await;

    let without = Jobs::new(o.transport.clone(), None);
    match without
        .publish_and_wait(job(&q, "add"), Duration::from_secs(1))
        .await
    {
        Err(WaitError::Queue(Error::NotSupported(m))) => assert!(m.contains("status"), "{m}"),
        other => panic!("expected a clear error without a store, got {other:?}"),
    }
    Ok(())
}

/// A follower sees a job's changes in order, each once, up to its final state.
pub async fn followers_see_changes_in_order(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let jobs = Jobs::new(o.transport.clone(), Some(o.status.clone()));
    let e = job(&q, "steps");
    let id = e.id;
    jobs.publish(e).await?;
    // What the follower saw last. The handler takes its next step only once the follower
    // has seen the last: the status writer folds changes that reach it together into one
    // row write (by design), so on a loaded machine fixed sleeps let two steps fold and
    // the follower rightly see one.
    let (saw, seen_last) = tokio::sync::watch::channel((JobState::Pending, 0u8));
    let follower = {
        let status = o.status.clone();
        tokio::spawn(async move {
            let mut seen: Vec<JobStatus> = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut version = 0;
            while let Some(s) = next_change(status.as_ref(), id, version, deadline).await? {
                version = s.version;
                let done = s.state.is_final();
                let _ = saw.send((s.state, s.progress));
                seen.push(s);
                if done {
                    break;
                }
            }
            Ok::<_, Error>(seen)
        })
    };
    let worker = Worker::new(o.transport.clone(), q.clone(), options(3))
        .with_status(o.status.clone())
        .handle(
            "steps",
            handler_fn(move |ctx: JobContext| {
                let mut seen_last = seen_last.clone();
                async move {
                    seen_step(&mut seen_last, 0).await;
                    for p in [25, 50, 75] {
                        ctx.progress(p, format!("step {p}"));
                        seen_step(&mut seen_last, p).await;
                    }
                    ctx.set_result(&"done")?;
                    Ok(())
                }
            }),
        );
    let stop = CancellationToken::new();
    let running = spawn(worker, &stop);
    let seen = follower
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))??;
    stop.cancel();
    let _ = running.await;
    let versions: Vec<u64> = seen.iter().map(|s| s.version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "versions in order: {versions:?}"
    );
    let steps: Vec<(JobState, u8)> = seen.iter().map(|s| (s.state, s.progress)).collect();
    assert_eq!(
        steps,
        vec![
            (JobState::Pending, 0),
            (JobState::Running, 0),
            (JobState::Running, 25),
            (JobState::Running, 50),
            (JobState::Running, 75),
            (JobState::Completed, 100),
        ]
    );
    Ok(())
}

/// Waits (up to 20 s, then goes on and lets the assertion say what was missed) until the
/// follower has seen the job running at `progress`.
async fn seen_step(last: &mut tokio::sync::watch::Receiver<(JobState, u8)>, progress: u8) {
    let seen = last.wait_for(|&last| last == (JobState::Running, progress));
    let _ = tokio::time::timeout(Duration::from_secs(20), seen).await;
}

/// Pruning removes finished records older than the cut, and nothing unfinished; the
/// throughput counts finished jobs per queue.
pub async fn prune_and_throughput(h: Arc<dyn Harness>) -> Result<()> {
    let o = open(&h).await?;
    let q = fresh_queue();
    let st = o.status.as_ref();
    let done = job(&q, "k");
    let dead = job(&q, "k");
    let open_job = job(&q, "k");
    st.record(&[
        StatusUpdate::completed(&done, 1, None),
        StatusUpdate::ended(&dead, 3, JobState::Dead, Some("x")),
        StatusUpdate::running(&open_job, 1),
    ])
    .await?;
    let buckets = st
        .throughput(Duration::from_secs(300), Duration::from_secs(10))
        .await?;
    let ours: Vec<_> = buckets.iter().filter(|b| b.queue == q.as_str()).collect();
    let (completed, failed) = ours
        .iter()
        .fold((0, 0), |(c, f), b| (c + b.completed, f + b.failed));
    assert_eq!((completed, failed), (1, 1), "{buckets:?}");
    assert_eq!(st.prune(Duration::from_secs(3600)).await?, 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(st.prune(Duration::from_millis(10)).await?, 2);
    assert_eq!(st.get(done.id).await?, None);
    assert_eq!(st.get(dead.id).await?, None);
    assert!(st.get(open_job.id).await?.is_some());
    let recent = st.recent(10).await?;
    assert_eq!(
        recent.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![open_job.id]
    );
    Ok(())
}

/// Expands to one `#[test]` per status case, against a harness made by `$harness`.
#[macro_export]
macro_rules! status_tests {
    ($harness:expr) => {
        $crate::status_tests!(@cases $harness;
            status_walks_pending_running_completed,
            status_batches_larger_than_a_statement_are_written_whole,
            status_records_retrying_dead_and_failed,
            status_of_a_replayed_dead_letter_starts_over,
            status_of_unhandled_and_released_jobs,
            stale_status_updates_are_fenced,
            publish_and_wait_returns_result_failure_or_timeout,
            followers_see_changes_in_order,
            prune_and_throughput,
            status_keeps_payload_worker_and_failed_attempts,
            a_reset_job_forgets_its_failed_attempts,
            jobs_are_listed_by_queue_state_and_search_with_counts,
            workers_report_themselves_and_leave,
            a_worker_beats_through_its_grace_period
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::status_cases::$case);
            }
        )*
    };
}
