//! `switchyard bench`: enqueue (one by one and batched), drain at a fixed concurrency
//! with a no-op handler, and pickup latency, per backend and claim strategy. Every job
//! is checked off: the report counts duplicates and missing jobs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use switchyard::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use switchyard::{
    CancellationToken, ClaimStrategy, Config, Envelope, Error, QueueName, Result, Transport,
};
use uuid::Uuid;

use crate::cli::BenchArgs;

/// Messages per batched publish.
const PUBLISH_BATCH: usize = 100;
/// Pickup latency: messages published at a fixed rate to an idle consumer.
const PICKUP_MESSAGES: usize = 200;
const PICKUP_INTERVAL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Serialize)]
struct Sample {
    enqueue_single_per_s: f64,
    enqueue_batch_per_s: f64,
    drain_per_s: f64,
    pickup_p50_ms: f64,
    pickup_p99_ms: f64,
    duplicates: u64,
    missing: u64,
}

/// What wakes an idle worker on `t`, for the report.
fn wake_source(t: &dyn Transport) -> &'static str {
    let probe = QueueName::new("probe").ok();
    match probe.and_then(|q| t.waker(&q)) {
        Some(_) => "in-process publish signal, polling 20 ms-1 s otherwise",
        None => "polling, 20 ms-1 s backoff",
    }
}

#[derive(Debug, Serialize)]
struct Report {
    backend: String,
    claim: String,
    /// What woke the idle worker in the pickup measurement.
    wake: String,
    runs: usize,
    messages: usize,
    concurrency: usize,
    /// Medians over the runs; duplicates and missing are totals, and both must be 0.
    #[serde(flatten)]
    summary: Sample,
    samples: Vec<Sample>,
}

pub(crate) async fn run(config: &Config, args: BenchArgs, json: bool) -> Result<()> {
    let claims = match args.only_claim.as_deref() {
        Some(c) => vec![c.parse::<ClaimStrategy>()?],
        None => vec![ClaimStrategy::SkipLocked, ClaimStrategy::Optimistic],
    };
    let mut reports = Vec::new();
    for claim in claims {
        let mut samples = Vec::new();
        let mut backend = String::new();
        let mut wake = String::new();
        for run in 0..args.runs.max(1) {
            let target = Target::new(config, claim)?;
            let t = target.open().await?;
            backend = t.name().to_owned();
            wake = wake_source(t.as_ref()).to_owned();
            if !json {
                eprintln!(
                    "bench: {backend} {claim} run {}/{}",
                    run + 1,
                    args.runs.max(1)
                );
            }
            samples.push(measure(&t, &args).await?);
        }
        reports.push(summarise(backend, wake, claim, &args, samples));
    }
    if json {
        return crate::output::json_line(&serde_json::json!({ "results": reports }));
    }
    println!(
        "{:<8} {:<12} {:>14} {:>14} {:>12} {:>10} {:>10} {:>6} {:>8}",
        "BACKEND",
        "CLAIM",
        "ENQ 1x1 /s",
        "ENQ x100 /s",
        "DRAIN /s",
        "P50 ms",
        "P99 ms",
        "DUPS",
        "MISSING"
    );
    for r in &reports {
        println!(
            "{:<8} {:<12} {:>14.0} {:>14.0} {:>12.0} {:>10.1} {:>10.1} {:>6} {:>8}",
            r.backend,
            r.claim,
            r.summary.enqueue_single_per_s,
            r.summary.enqueue_batch_per_s,
            r.summary.drain_per_s,
            r.summary.pickup_p50_ms,
            r.summary.pickup_p99_ms,
            r.summary.duplicates,
            r.summary.missing
        );
    }
    println!(
        "medians of {} runs; drain of {} jobs at concurrency {}; pickup woken by {}",
        args.runs.max(1),
        args.messages,
        args.concurrency,
        reports.first().map_or("-", |r| r.wake.as_str())
    );
    Ok(())
}

/// Where one run measures: a fresh store that nothing else uses.
struct Target {
    config: Config,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    fn new(config: &Config, claim: ClaimStrategy) -> Result<Self> {
        let mut config = config.clone();
        config.claim = claim;
        let mut dir = None;
        if config.database_url.scheme() == "sqlite" {
            // A fresh file per run: the user's database is never touched.
            let d = tempfile::tempdir().map_err(|e| {
                Error::InvalidInput(format!("cannot create a temporary directory: {e}"))
            })?;
            let url = format!("sqlite://{}", d.path().join("bench.db").display());
            let lookup_url = url.clone();
            let fresh =
                Config::from_lookup(|var| (var == "DATABASE_URL").then(|| lookup_url.clone()))?;
            config.database_url = fresh.database_url;
            dir = Some(d);
        }
        Ok(Target { config, _dir: dir })
    }

    async fn open(&self) -> Result<Arc<dyn Transport>> {
        switchyard::connect(&self.config).await
    }
}

fn queue(label: &str) -> Result<QueueName> {
    Ok(QueueName::new(format!(
        "bench.{label}.{}",
        Uuid::new_v4().simple()
    ))?)
}

fn jobs(queue: &QueueName, n: usize) -> Result<Vec<Envelope>> {
    (0..n)
        .map(|i| {
            Envelope::builder(queue.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .build()
        })
        .collect()
}

async fn measure(t: &Arc<dyn Transport>, args: &BenchArgs) -> Result<Sample> {
    // Enqueue one by one: one commit each.
    let single_n = (args.messages / 10).clamp(100, 2_000);
    let q = queue("single")?;
    let envs = jobs(&q, single_n)?;
    let started = Instant::now();
    for env in envs {
        t.publish(env).await?;
    }
    let enqueue_single_per_s = single_n as f64 / started.elapsed().as_secs_f64();

    // Enqueue in batches; the same jobs are then drained.
    let q = queue("drain")?;
    let envs = jobs(&q, args.messages)?;
    let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
    let started = Instant::now();
    for chunk in envs.chunks(PUBLISH_BATCH) {
        t.publish_batch(chunk.to_vec()).await?;
    }
    let enqueue_batch_per_s = args.messages as f64 / started.elapsed().as_secs_f64();

    let (drain_per_s, duplicates, missing) = drain(t, &q, &ids, args.concurrency).await?;
    let (pickup_p50_ms, pickup_p99_ms) = pickup(t).await?;
    Ok(Sample {
        enqueue_single_per_s,
        enqueue_batch_per_s,
        drain_per_s,
        pickup_p50_ms,
        pickup_p99_ms,
        duplicates,
        missing,
    })
}

/// Drains with the worker runtime (batched claims, coalesced acks) and a no-op handler.
async fn drain(
    t: &Arc<dyn Transport>,
    q: &QueueName,
    ids: &[Uuid],
    concurrency: usize,
) -> Result<(f64, u64, u64)> {
    let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
    let record = seen.clone();
    let options = WorkerOptions::default()
        .with_concurrency(concurrency)
        .with_poll(Duration::from_millis(1), Duration::from_millis(10))
        .with_drain(true);
    let worker = Worker::new(t.clone(), q.clone(), options).handle(
        "noop",
        handler_fn(move |ctx: JobContext| {
            if let Ok(mut seen) = record.lock() {
                *seen.entry(ctx.envelope.id).or_default() += 1;
            }
            async { Ok(()) }
        }),
    );
    let started = Instant::now();
    worker.run(CancellationToken::new()).await?;
    let elapsed = started.elapsed();
    let seen = seen
        .lock()
        .map_err(|_| Error::InvalidInput("bench lock poisoned".into()))?;
    let duplicates = seen.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    let missing = ids.iter().filter(|id| !seen.contains_key(id)).count() as u64;
    Ok((
        ids.len() as f64 / elapsed.as_secs_f64(),
        duplicates,
        missing,
    ))
}

/// Publishes at a fixed rate to an idle worker (default polling, plus the transport's
/// wake-up signal where it has one) and measures publish → handler start.
async fn pickup(t: &Arc<dyn Transport>) -> Result<(f64, f64)> {
    let q = queue("pickup")?;
    let sent: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (s, l) = (sent.clone(), latencies.clone());
    let worker = Worker::new(t.clone(), q.clone(), WorkerOptions::default()).handle(
        "noop",
        handler_fn(move |ctx: JobContext| {
            let at = Instant::now();
            let start = s.lock().ok().and_then(|m| m.get(&ctx.envelope.id).copied());
            if let (Some(start), Ok(mut l)) = (start, l.lock()) {
                l.push(at.duration_since(start));
            }
            async { Ok(()) }
        }),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    // Let the worker fall idle first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut tick = tokio::time::interval(PICKUP_INTERVAL);
    for env in jobs(&q, PICKUP_MESSAGES)? {
        tick.tick().await;
        sent.lock()
            .map_err(|_| Error::InvalidInput("bench lock poisoned".into()))?
            .insert(env.id, Instant::now());
        t.publish(env).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while latencies.lock().map(|l| l.len()).unwrap_or(0) < PICKUP_MESSAGES {
        if Instant::now() > deadline {
            return Err(Error::InvalidInput(
                "pickup: messages not handled within 60 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("pickup worker failed: {e}")))??;
    let mut latencies = latencies
        .lock()
        .map_err(|_| Error::InvalidInput("bench lock poisoned".into()))?
        .clone();
    latencies.sort();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok((pct(0.50), pct(0.99)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn summarise(
    backend: String,
    wake: String,
    claim: ClaimStrategy,
    args: &BenchArgs,
    samples: Vec<Sample>,
) -> Report {
    let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    Report {
        backend,
        claim: claim.to_string(),
        wake,
        runs: samples.len(),
        messages: args.messages,
        concurrency: args.concurrency,
        summary: Sample {
            enqueue_single_per_s: m(|s| s.enqueue_single_per_s),
            enqueue_batch_per_s: m(|s| s.enqueue_batch_per_s),
            drain_per_s: m(|s| s.drain_per_s),
            pickup_p50_ms: m(|s| s.pickup_p50_ms),
            pickup_p99_ms: m(|s| s.pickup_p99_ms),
            duplicates: samples.iter().map(|s| s.duplicates).sum(),
            missing: samples.iter().map(|s| s.missing).sum(),
        },
        samples,
    }
}
