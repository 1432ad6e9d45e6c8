//! `switchyard demo`: the newcomer's first run. Publishes a realistic batch of invoice
//! jobs, works them with a live progress bar, and ends with a short summary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use switchyard::worker::{
    handler_fn, JobContext, JobError, JobResult, RetryPolicy, Worker, WorkerOptions, WorkerReport,
};
use switchyard::{CancellationToken, Config, Envelope, QueueName, Result, Transport};

use crate::cli::DemoArgs;

const QUEUE: &str = "demo.invoices";
const CONCURRENCY: usize = 8;
const MAX_ATTEMPTS: u32 = 3;
const BACKOFF_BASE: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(200);

#[derive(Deserialize)]
struct Invoice {
    run: String,
    invoice: String,
    customer: u32,
    /// How many deliveries fail before this invoice goes through (the demo's stand-in
    /// for a flaky payment provider).
    fail_first: u32,
}

pub(crate) async fn run(config: &Config, args: DemoArgs, json: bool) -> Result<()> {
    let jobs = args.jobs.max(1);
    let transport = switchyard::connect(config).await?;
    let envelopes = invoices(jobs)?;

    let started = Instant::now();
    let bar = crate::output::progress(jobs as u64, "publishing", json);
    for chunk in envelopes.chunks(250) {
        transport.publish_batch(chunk.to_vec()).await?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let published_in = started.elapsed();

    let work_started = Instant::now();
    let report = work(transport.clone(), jobs, json).await?;
    let worked_in = work_started.elapsed();
    let (processed, retried, dead) = (report.succeeded, report.retried, report.dead_lettered);
    let rate = (processed + dead) as f64 / worked_in.as_secs_f64().max(1e-6);
    if json {
        return crate::output::json_line(&serde_json::json!({
            "queue": QUEUE,
            "backend": transport.name(),
            "published": jobs,
            "processed": processed,
            "retried": retried,
            "dead_lettered": dead,
            "publish_seconds": published_in.as_secs_f64(),
            "work_seconds": worked_in.as_secs_f64(),
            "jobs_per_second": rate,
        }));
    }
    outln!(
        "Published {jobs} invoice jobs to {QUEUE} on {} ({}) in {}.",
        transport.name(),
        super::common::store_url(config),
        crate::output::human_duration(published_in)
    );
    outln!(
        "Processed {processed}, retried {retried} transient failures, dead-lettered {dead}, in {} ({rate:.0} jobs/s).",
        crate::output::human_duration(worked_in)
    );
    outln!();
    print_next_steps();
    Ok(())
}

/// `jobs` invoices of a new run: a few fail once or twice, the one in the middle
/// always.
fn invoices(jobs: usize) -> Result<Vec<Envelope>> {
    let run = uuid::Uuid::now_v7().simple().to_string()[..8].to_owned();
    let hopeless = jobs / 2;
    (0..jobs)
        .map(|i| {
            let fail_first = if i == hopeless {
                u32::MAX
            } else if i % 37 == 5 {
                1 + (i % 2) as u32
            } else {
                0
            };
            Envelope::builder(QUEUE, "send_invoice")
                .payload(&serde_json::json!({
                    "run": run,
                    "invoice": format!("INV-{run}-{i:05}"),
                    "customer": 1000 + i % 97,
                    "amount_cents": 1_000 + (i * 7_919) % 90_000,
                    "fail_first": fail_first,
                }))
                .max_attempts(MAX_ATTEMPTS)
                .header("source", "switchyard-demo")
                .build()
        })
        .collect()
}

/// Works the queue empty behind a progress bar.
async fn work(transport: Arc<dyn Transport>, jobs: usize, json: bool) -> Result<WorkerReport> {
    // Short backoff so the demo finishes in seconds; real workers use seconds to minutes.
    let options = WorkerOptions::default()
        .with_concurrency(CONCURRENCY)
        .with_retry(RetryPolicy::new(BACKOFF_BASE, BACKOFF_MAX, MAX_ATTEMPTS))
        .with_poll(Duration::from_millis(5), Duration::from_millis(50))
        .with_drain(true);
    let worker = Worker::new(transport, QueueName::new(QUEUE)?, options)
        .handle("send_invoice", handler_fn(send_invoice));
    let counters = worker.counters();
    let bar = crate::output::progress(jobs as u64, "invoicing", json);
    let progress = {
        let bar = bar.clone();
        tokio::spawn(async move {
            loop {
                let now = counters.snapshot();
                bar.set_position(now.succeeded + now.dead_lettered);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let report = worker.run(CancellationToken::new()).await;
    progress.abort();
    bar.finish_and_clear();
    report
}

/// The commands that come next, as this very binary is called (target/release/switchyard
/// after a `cargo run`), so they can be pasted as they are.
fn print_next_steps() {
    let me = std::env::args()
        .next()
        .filter(|a| a.contains('/'))
        .unwrap_or_else(|| "switchyard".into());
    outln!("Inspect and replay what failed for good:");
    outln!("  {me} dead list --queue {QUEUE}");
    outln!("  {me} dead replay --all --queue {QUEUE}");
    outln!("  {me} stats");
}

/// The demo's handler: "charges" an invoice; a few fail transiently, one for good.
async fn send_invoice(ctx: JobContext) -> JobResult {
    let inv: Invoice = ctx
        .payload()
        .map_err(|e| JobError::fail(format!("not an invoice: {e}")))?;
    if ctx.attempt <= inv.fail_first {
        return Err(if inv.fail_first == u32::MAX {
            JobError::retry(format!(
                "card declined: customer {} has no valid payment method ({})",
                inv.customer, inv.invoice
            ))
        } else {
            JobError::retry(format!(
                "payment provider timed out (HTTP 504) for {} of run {}",
                inv.invoice, inv.run
            ))
        });
    }
    Ok(())
}
