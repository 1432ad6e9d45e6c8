//! `switchyard demo`: the newcomer's first run. Publishes a realistic batch of invoice
//! jobs, works them with a live progress bar, and ends with a short summary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use switchyard::{reason, Config, Envelope, QueueName, Reservation, Result, Transport};

use crate::cli::DemoArgs;

const QUEUE: &str = "demo.invoices";
const CONSUMERS: usize = 4;
const MAX_ATTEMPTS: u32 = 3;
/// Short backoff so the demo finishes in seconds; real workers use seconds to minutes.
const BACKOFF_BASE: Duration = Duration::from_millis(40);

#[derive(Deserialize)]
struct Invoice {
    run: String,
    invoice: String,
    customer: u32,
    /// How many deliveries fail before this invoice goes through (the demo's stand-in
    /// for a flaky payment provider).
    fail_first: u32,
}

#[derive(Default)]
struct Tally {
    processed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
}

pub(crate) async fn run(config: &Config, args: DemoArgs, json: bool) -> Result<()> {
    let jobs = args.jobs.max(1);
    let transport = super::connect(config).await?;
    let queue = QueueName::new(QUEUE)?;
    let run = uuid::Uuid::now_v7().simple().to_string()[..8].to_owned();
    let hopeless = jobs / 2;
    let envelopes: Vec<Envelope> = (0..jobs)
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
        .collect::<Result<_>>()?;

    let started = Instant::now();
    let bar = crate::output::progress(jobs as u64, "publishing", json);
    for chunk in envelopes.chunks(250) {
        transport.publish_batch(chunk.to_vec()).await?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let published_in = started.elapsed();

    let tally = Arc::new(Tally::default());
    let bar = crate::output::progress(jobs as u64, "invoicing", json);
    let work_started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONSUMERS {
        let (t, q, tally, bar, run) = (
            transport.clone(),
            queue.clone(),
            tally.clone(),
            bar.clone(),
            run.clone(),
        );
        tasks.push(tokio::spawn(async move {
            consume(t.as_ref(), &q, &tally, &bar, &run, jobs as u64).await
        }));
    }
    for task in tasks {
        task.await.map_err(|e| {
            switchyard::Error::InvalidInput(format!("a demo consumer failed: {e}"))
        })??;
    }
    bar.finish_and_clear();
    let worked_in = work_started.elapsed();
    let (processed, retried, dead) = (
        tally.processed.load(Ordering::SeqCst),
        tally.retried.load(Ordering::SeqCst),
        tally.dead.load(Ordering::SeqCst),
    );
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
    println!(
        "Published {jobs} invoice jobs to {QUEUE} on {} ({}) in {}.",
        transport.name(),
        config.database_url,
        crate::output::human_duration(published_in)
    );
    println!(
        "Processed {processed}, retried {retried} transient failures, dead-lettered {dead}, in {} ({rate:.0} jobs/s).",
        crate::output::human_duration(worked_in)
    );
    println!();
    println!("Inspect and replay what failed for good:");
    println!("  switchyard dead list --queue {QUEUE}");
    println!("  switchyard dead replay --all --queue {QUEUE}");
    println!("  switchyard stats");
    Ok(())
}

async fn consume(
    t: &dyn Transport,
    queue: &QueueName,
    tally: &Tally,
    bar: &indicatif::ProgressBar,
    run: &str,
    total: u64,
) -> Result<()> {
    let finished =
        || tally.processed.load(Ordering::SeqCst) + tally.dead.load(Ordering::SeqCst) >= total;
    while !finished() {
        let batch = t.reserve_batch(queue, 25).await?;
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let mut done: Vec<Reservation> = Vec::with_capacity(batch.len());
        let mut ours_done = 0;
        for r in batch {
            let invoice: Option<Invoice> = r.envelope.payload_as().ok();
            let ours = invoice.as_ref().is_some_and(|i| i.run == run);
            let attempt = r.envelope.attempts;
            match invoice {
                Some(inv) if attempt < inv.fail_first => {
                    let error = if inv.fail_first == u32::MAX {
                        format!(
                            "card declined: customer {} has no valid payment method ({})",
                            inv.customer, inv.invoice
                        )
                    } else {
                        format!("payment provider timed out (HTTP 504) for {}", inv.invoice)
                    };
                    let limit = r.envelope.max_attempts.unwrap_or(MAX_ATTEMPTS);
                    if attempt + 1 >= limit {
                        t.dead_letter(&r, reason::MAX_ATTEMPTS, Some(&error))
                            .await?;
                        if ours {
                            tally.dead.fetch_add(1, Ordering::SeqCst);
                            bar.inc(1);
                        }
                    } else {
                        t.release(&r, BACKOFF_BASE * 2u32.pow(attempt), Some(&error))
                            .await?;
                        if ours {
                            tally.retried.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                _ => {
                    ours_done += u64::from(ours);
                    done.push(r);
                }
            }
        }
        t.ack_batch(&done).await?;
        tally.processed.fetch_add(ours_done, Ordering::SeqCst);
        bar.inc(ours_done);
    }
    Ok(())
}
