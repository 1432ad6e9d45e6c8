//! Cases of checkpoints: a write lands only under the run that holds the job, and a
//! stale run's late write changes nothing; a redelivered job resumes from its
//! checkpoint through the worker, and completing removes it; dead letters keep theirs;
//! old ones are pruned.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::harness::{open_beside, Beside, Harness};
use super::worker_support::{drain, fast, fresh_queue, job};
use crate::checkpoint::{CheckpointStore, Fence, MAX_CHECKPOINT_BYTES};
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{Error, QueueName, Reservation, Result, Transport, TransportExt};

/// A fresh store's transport, status store and checkpoints, or `None` (said why)
/// where the backend keeps no checkpoints (RabbitMQ without a control store).
async fn open_checkpointed(h: &Arc<dyn Harness>) -> Result<Option<Beside<dyn CheckpointStore>>> {
    open_beside(
        h,
        |s, caps| s?.checkpoints().filter(|_| caps.checkpoints),
        "its runs' checkpoints cannot be fenced in a store beside it",
    )
    .await
}

fn now() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The next delivery of `q`, waiting for a broker's redelivery.
async fn next_delivery(t: &dyn Transport, q: &QueueName) -> Result<Reservation> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = t.reserve(q).await? {
            return Ok(r);
        }
        if Instant::now() > deadline {
            return Err(Error::InvalidInput(
                "the job was not delivered again within 10 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A run that lost its job cannot overwrite its successor's checkpoint; the run that
/// holds it can, also with the same value twice; a dead letter keeps its checkpoint
/// for a replay; pruning removes those written before its cutoff.
pub async fn a_checkpoint_is_fenced_by_the_run_that_holds_the_job(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let Some((_store, t, _status, checkpoints)) = open_checkpointed(&h).await? else {
        return Ok(());
    };
    let caps = t.capabilities();
    let q = fresh_queue();
    let env = job(&q, "import");
    let id = env.id;
    t.publish(env).await?;
    let first = next_delivery(t.as_ref(), &q).await?;
    let stale = Fence::for_run(&caps, &first).expect("a store that keeps checkpoints fences them");
    assert!(
        checkpoints
            .save(id, stale, r#"{"done":1000}"#, now())
            .await?
    );
    assert_eq!(
        checkpoints.load(id).await?.as_deref(),
        Some(r#"{"done":1000}"#)
    );

    // The job goes back (a crash, a deploy) and another run takes it.
    t.release(&first, Duration::ZERO, Some("the worker went away"))
        .await?;
    let second = next_delivery(t.as_ref(), &q).await?;
    let current = Fence::for_run(&caps, &second).expect("a fence");
    assert_ne!(stale, current, "each run has a fence of its own");
    assert!(
        !checkpoints
            .save(id, stale, r#"{"done":5000}"#, now())
            .await?,
        "a stale run's checkpoint is refused"
    );
    assert_eq!(
        checkpoints.load(id).await?.as_deref(),
        Some(r#"{"done":1000}"#),
        "a refused checkpoint changes nothing"
    );
    let at = now();
    for _ in 0..2 {
        assert!(
            checkpoints
                .save(id, current, r#"{"done":2000}"#, at)
                .await?,
            "the holder's checkpoint lands, the same one again too"
        );
    }

    t.dead_letter(&second, "failed", Some("gave up")).await?;
    assert_eq!(
        checkpoints.load(id).await?.as_deref(),
        Some(r#"{"done":2000}"#),
        "a dead letter keeps its checkpoint for a replay"
    );

    assert_eq!(
        checkpoints.prune(at).await?,
        0,
        "written at the cutoff: kept"
    );
    assert!(checkpoints.prune(at + 1).await? >= 1);
    assert_eq!(checkpoints.load(id).await?, None, "pruned");
    Ok(())
}

/// What each run of the worker case saw and was told.
#[derive(Debug, Default)]
struct Seen {
    resumed_from: Vec<Option<u64>>,
    too_large: Vec<String>,
}

/// Through the worker: a retried job reads the checkpoint its first run stored and
/// resumes from it; a checkpoint over the size limit is refused, naming it; once the
/// job completes its checkpoint is removed.
pub async fn a_redelivered_job_resumes_from_its_checkpoint(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, status, checkpoints)) = open_checkpointed(&h).await? else {
        return Ok(());
    };
    let q = fresh_queue();
    let env = job(&q, "import");
    let id = env.id;
    t.publish(env).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handler_seen = seen.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast())
        .with_status(status)
        .handle(
            "import",
            handler_fn(move |ctx: JobContext| {
                let seen = handler_seen.clone();
                async move {
                    let from = ctx.checkpoint_as::<u64>().await?;
                    let big = "x".repeat(MAX_CHECKPOINT_BYTES);
                    let refused = ctx.checkpoint(&big).await.map_err(|e| e.to_string());
                    if let Ok(mut seen) = seen.lock() {
                        seen.resumed_from.push(from);
                        seen.too_large.push(refused.err().unwrap_or_default());
                    }
                    ctx.checkpoint(&(from.unwrap_or(0) + 1000)).await?;
                    if ctx.attempt == 1 {
                        return Err(JobError::retry_after(
                            Duration::from_millis(10),
                            "a deploy stopped it",
                        ));
                    }
                    Ok(())
                }
            }),
        );
    let report = drain(worker).await?;
    assert_eq!(report.succeeded, 1, "{report:?}");
    {
        let seen = seen
            .lock()
            .map_err(|_| Error::InvalidInput("poisoned".into()))?;
        assert_eq!(seen.resumed_from, vec![None, Some(1000)]);
        for e in &seen.too_large {
            assert!(
                e.contains("too large") && e.contains(&MAX_CHECKPOINT_BYTES.to_string()),
                "{e}"
            );
        }
    }
    // Removed once the ack committed, in the background.
    let deadline = Instant::now() + Duration::from_secs(5);
    while checkpoints.load(id).await?.is_some() {
        assert!(
            Instant::now() < deadline,
            "a completed job's checkpoint is removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
