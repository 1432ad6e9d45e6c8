//! Cases of job logs: each attempt keeps its last lines, capped, after the job
//! completes; pruning removes them by age.

use std::sync::Arc;
use std::time::Duration;

use super::harness::{Harness, OpenOptions};
use super::worker_support::{drain, fast, fresh_queue, job};
use crate::job_log::MAX_LOG_BYTES;
use crate::worker::{handler_fn, JobContext, JobError, Worker};
use crate::{Result, TransportExt};

/// A job that logs 2,000 lines per attempt and fails its first: its lines are stored
/// while it runs; both attempts' last lines are kept, each within the cap and saying
/// how many went; pruning removes them.
pub async fn each_attempt_keeps_its_last_log_lines(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let (t, status) = store.open_with_status(OpenOptions::default()).await?;
    let Some(logs) = status.as_ref().and_then(|s| s.job_logs()) else {
        eprintln!(
            "not applicable to {}: no store beside it keeps logs",
            t.name()
        );
        return Ok(());
    };
    let Some(status) = status else {
        return Ok(());
    };
    let q = fresh_queue();
    let env = job(&q, "noisy");
    let id = env.id;
    t.publish(env).await?;
    let seen_while_running = logs.clone();
    let worker = Worker::new(t.clone(), q.clone(), fast())
        .with_status(status)
        .handle(
            "noisy",
            handler_fn(move |ctx: JobContext| {
                let store = seen_while_running.clone();
                async move {
                    for n in 0..2_000 {
                        ctx.log(format!("attempt {} line {n}", ctx.attempt));
                    }
                    if ctx.attempt == 1 {
                        return Err(JobError::retry_after(Duration::from_millis(10), "again"));
                    }
                    // Lines are stored while the job runs, within a second or so.
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    loop {
                        let now = store.get(ctx.envelope.id).await?;
                        if now
                            .iter()
                            .any(|l| l.attempt == 2 && l.lines.contains("line 1999"))
                        {
                            return Ok(());
                        }
                        if std::time::Instant::now() > deadline {
                            return Err(JobError::fail("the lines were not stored while running"));
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }),
        );
    let report = drain(worker).await?;
    assert_eq!(report.succeeded, 1, "{report:?}");
    let kept = logs.get(id).await?;
    assert_eq!(
        kept.iter().map(|l| l.attempt).collect::<Vec<_>>(),
        vec![1, 2],
        "{kept:?}"
    );
    for log in &kept {
        assert!(log.lines.len() <= MAX_LOG_BYTES + 40, "{}", log.lines.len());
        assert!(
            log.lines
                .ends_with(&format!("attempt {} line 1999\n", log.attempt)),
            "the last line is kept"
        );
        assert!(
            log.lines.starts_with('…') && log.lines.contains("earlier lines dropped"),
            "says what went"
        );
    }
    let newest = kept.iter().map(|l| l.updated_at).max().expect("logs");
    assert_eq!(
        logs.prune(newest.timestamp_micros() - 10_000_000).await?,
        0,
        "newer than the cutoff: kept"
    );
    assert!(logs.prune(newest.timestamp_micros() + 1).await? >= 2);
    assert!(logs.get(id).await?.is_empty(), "pruned");
    Ok(())
}
