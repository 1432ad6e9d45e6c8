//! `switchyard bench`: enqueue (one by one and batched), drain at a fixed concurrency
//! with a no-op handler, and pickup latency, per backend and claim strategy. Every job
//! is checked off: the report counts duplicates and missing jobs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use switchyard::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use switchyard::{
    BackendKind, CancellationToken, ClaimStrategy, Config, Envelope, Error, Jobs, QueueName,
    Result, StatusStore, Transport, TransportExt,
};
use uuid::Uuid;

use super::baseline::{self, Baseline};
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
    /// The same drain with `--depth` more messages queued behind the measured ones.
    drain_deep_per_s: Option<f64>,
    /// The same drain recording each job's status (published `pending` through `Jobs`,
    /// then `running` and `completed`), where the backend keeps status.
    drain_status_per_s: Option<f64>,
    pickup_p50_ms: f64,
    pickup_p99_ms: f64,
    duplicates: u64,
    missing: u64,
}

/// Optimistic claims racing each other: bare reservers (reserve 10, ack 10, repeat).
#[derive(Debug, Clone, Serialize)]
struct Contention {
    reservers: usize,
    jobs_per_s: f64,
    /// Rows a competitor took between an optimistic claim's read and its compare-and-set,
    /// over the rows it tried to take.
    wasted_claim_ratio: f64,
    /// Claim statements that lost a deadlock and ran again.
    conflicts: u64,
}

/// What wakes an idle worker on `t`, for the report.
fn wake_source(t: &dyn Transport) -> &'static str {
    let probe = QueueName::new("probe").ok();
    match (t.name(), probe.and_then(|q| t.wake_signal(&q))) {
        ("postgres", Some(_)) => {
            "LISTEN/NOTIFY (publisher on its own connection pool), polling 20 ms-1 s otherwise"
        }
        ("mysql", Some(_)) => {
            "polling the newest seq every 20 ms (publisher on its own connection pool), \
             the worker's own polling 20 ms-1 s otherwise"
        }
        ("amqp", Some(_)) => {
            "the broker's push to the consumer (basic.consume with a prefetch), \
             publisher on its own connection"
        }
        (_, Some(_)) => "in-process publish signal, polling 20 ms-1 s otherwise",
        (_, None) => "polling, 20 ms-1 s backoff",
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
    /// Messages queued behind the measured ones in the deep drain.
    depth: usize,
    /// Medians over the runs; duplicates and missing are totals, and both must be 0.
    #[serde(flatten)]
    summary: Sample,
    samples: Vec<Sample>,
    /// The claim's plan at the deep drain's depth (PostgreSQL).
    #[serde(skip_serializing_if = "Option::is_none")]
    claim_plan: Option<String>,
    /// Medians over the runs, per number of reservers (optimistic claims on PostgreSQL).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    contention: Vec<Contention>,
    /// Bare SQL on the same server, measured once in each run (PostgreSQL, MySQL):
    /// medians, and the medians of each run's ratios of the queue to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<BaselineReport>,
}

#[derive(Debug, Serialize)]
struct BaselineReport {
    #[serde(flatten)]
    median: Baseline,
    enqueue_single_ratio: f64,
    enqueue_batch_ratio: f64,
    drain_ratio: f64,
}

/// Medians of the baseline runs and of each run's ratios (`samples[i]` ran beside
/// `bare[i]`).
fn baseline_report(samples: &[Sample], bare: &[Baseline]) -> Option<BaselineReport> {
    if bare.is_empty() || bare.len() != samples.len() {
        return None;
    }
    let ratio = |q: fn(&Sample) -> f64, b: fn(&Baseline) -> f64| {
        median(
            samples
                .iter()
                .zip(bare)
                .map(|(s, x)| q(s) / b(x).max(f64::MIN_POSITIVE))
                .collect(),
        )
    };
    Some(BaselineReport {
        median: Baseline {
            insert_single_per_s: median(bare.iter().map(|b| b.insert_single_per_s).collect()),
            insert_batch_per_s: median(bare.iter().map(|b| b.insert_batch_per_s).collect()),
            drain_per_s: median(bare.iter().map(|b| b.drain_per_s).collect()),
        },
        enqueue_single_ratio: ratio(|s| s.enqueue_single_per_s, |b| b.insert_single_per_s),
        enqueue_batch_ratio: ratio(|s| s.enqueue_batch_per_s, |b| b.insert_batch_per_s),
        drain_ratio: ratio(|s| s.drain_per_s, |b| b.drain_per_s),
    })
}

pub(crate) async fn run(config: &Config, args: BenchArgs, json: bool) -> Result<()> {
    let claims = match args.only_claim.as_deref() {
        // A broker has no claim strategy to compare.
        _ if config.backend == BackendKind::RabbitMq => vec![ClaimStrategy::SkipLocked],
        Some(c) => vec![c.parse::<ClaimStrategy>()?],
        None => vec![ClaimStrategy::SkipLocked, ClaimStrategy::Optimistic],
    };
    let mut reports = Vec::new();
    for claim in claims {
        let mut samples = Vec::new();
        let mut contention: Vec<Vec<Contention>> = Vec::new();
        let mut backend = String::new();
        let mut wake = String::new();
        let mut claim_plan = None;
        let mut bare = Vec::new();
        for run in 0..args.runs.max(1) {
            let target = Target::new(config, claim)?;
            let opened = target.open_jobs(None).await?;
            let t = opened.transport().clone();
            backend = t.name().to_owned();
            wake = wake_source(t.as_ref()).to_owned();
            if !json {
                let claim = if config.backend == BackendKind::RabbitMq {
                    "consumer".to_owned()
                } else {
                    claim.to_string()
                };
                errln!(
                    "bench: {backend} {claim} run {}/{}",
                    run + 1,
                    args.runs.max(1)
                );
            }
            let measured = measure(&target, &t, opened.store(), &args).await;
            let measured = match measured {
                Ok((sample, plan)) => {
                    claim_plan = plan.or(claim_plan);
                    samples.push(sample);
                    if claim == ClaimStrategy::Optimistic {
                        let mut per_run = Vec::new();
                        for &n in &args.reservers {
                            if let Some(c) = target.contention(n, args.messages).await? {
                                per_run.push(c);
                            }
                        }
                        contention.push(per_run);
                    }
                    Ok(())
                }
                Err(err) => Err(err),
            };
            target.cleanup().await;
            measured?;
            if args.baseline {
                let payloads: Vec<String> = jobs(&queue("bare")?, args.messages)?
                    .iter()
                    .map(Envelope::to_json)
                    .collect();
                let single = single_count(args.messages);
                if let Some(b) =
                    baseline::measure(config, &payloads, single, args.concurrency).await?
                {
                    bare.push(b);
                }
            }
        }
        let mut report = summarise(backend, wake, claim, &args, samples);
        if config.backend == BackendKind::RabbitMq {
            report.claim = "consumer".into();
        }
        report.claim_plan = claim_plan;
        report.contention = median_contention(&args.reservers, &contention);
        report.baseline = baseline_report(&report.samples, &bare);
        reports.push(report);
    }
    if json {
        return crate::output::json_line(&serde_json::json!({ "results": reports }));
    }
    outln!(
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
        outln!(
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
    outln!(
        "medians of {} runs; drain of {} jobs at concurrency {}; pickup woken by {}",
        args.runs.max(1),
        args.messages,
        args.concurrency,
        reports.first().map_or("-", |r| r.wake.as_str())
    );
    for r in &reports {
        if let Some(tracked) = r.summary.drain_status_per_s {
            outln!(
                "{} {}: drain recording job status: {tracked:.0} jobs/s ({:.0}% of the plain drain)",
                r.backend,
                r.claim,
                100.0 * tracked / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
            );
        }
        if let Some(deep) = r.summary.drain_deep_per_s {
            outln!(
                "{} {}: drain with {} more queued behind: {deep:.0} jobs/s ({:.0}% of the shallow drain)",
                r.backend,
                r.claim,
                r.depth,
                100.0 * deep / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
            );
        }
        for c in &r.contention {
            outln!(
                "{} {}: {} reservers: {:.0} jobs/s, wasted-claim ratio {:.3}, {} deadlock retries",
                r.backend,
                r.claim,
                c.reservers,
                c.jobs_per_s,
                c.wasted_claim_ratio,
                c.conflicts
            );
        }
    }
    for r in &reports {
        if let Some(b) = &r.baseline {
            outln!(
                "{} {}: bare {} in the same runs: {:.0} / {:.0} / {:.0} jobs/s \
                 (enqueue 1x1 / x100 / drain); the queue's ratios to it: {:.2} / {:.2} / {:.2}",
                r.backend,
                r.claim,
                if r.backend == "amqp" {
                    "lapin (drain: one consumer, prefetch 100)"
                } else {
                    "SQL"
                },
                b.median.insert_single_per_s,
                b.median.insert_batch_per_s,
                b.median.drain_per_s,
                b.enqueue_single_ratio,
                b.enqueue_batch_ratio,
                b.drain_ratio
            );
        }
    }
    if let Some(plan) = reports.iter().find_map(|r| r.claim_plan.as_ref()) {
        outln!("claim plan at the deep drain's depth:\n{plan}");
    }
    Ok(())
}

/// The median of each reserver count's runs.
fn median_contention(reservers: &[usize], runs: &[Vec<Contention>]) -> Vec<Contention> {
    reservers
        .iter()
        .filter_map(|&n| {
            let of_n: Vec<&Contention> = runs
                .iter()
                .flat_map(|r| r.iter().filter(|c| c.reservers == n))
                .collect();
            if of_n.is_empty() {
                return None;
            }
            Some(Contention {
                reservers: n,
                jobs_per_s: median(of_n.iter().map(|c| c.jobs_per_s).collect()),
                wasted_claim_ratio: median(of_n.iter().map(|c| c.wasted_claim_ratio).collect()),
                conflicts: of_n.iter().map(|c| c.conflicts).sum(),
            })
        })
        .collect()
}

/// Where one run measures: a fresh store that nothing else uses (a temporary SQLite
/// file, or a table of its own in PostgreSQL, dropped afterwards).
struct Target {
    config: Config,
    _dir: Option<tempfile::TempDir>,
    #[cfg(feature = "postgres")]
    pg: Mutex<Vec<Arc<switchyard::PgTransport>>>,
    #[cfg(feature = "mysql")]
    mysql: Mutex<Vec<Arc<switchyard::MySqlTransport>>>,
    #[cfg(feature = "amqp")]
    amqp: Mutex<Vec<Arc<switchyard::AmqpTransport>>>,
}

impl Target {
    fn new(config: &Config, claim: ClaimStrategy) -> Result<Self> {
        let mut config = config.clone();
        config.claim = claim;
        // One backend at a time, even during a migration.
        config.canary_percent = 0;
        config.drain = switchyard::DrainSetting::Off;
        let mut dir = None;
        match config.database_url.scheme().as_str() {
            // Fresh queue names per measurement, deleted afterwards.
            _ if config.backend == BackendKind::RabbitMq => {}
            "sqlite" => {
                // A fresh file per run: the user's database is never touched.
                let d = tempfile::tempdir()
                    .map_err(|e| Error::io("cannot create a temporary directory", e))?;
                let url = format!("sqlite://{}", d.path().join("bench.db").display());
                let lookup_url = url.clone();
                let fresh =
                    Config::from_lookup(|var| (var == "DATABASE_URL").then(|| lookup_url.clone()))?;
                config.database_url = fresh.database_url;
                dir = Some(d);
            }
            _ => {
                // A table of its own, in the configured schema: the user's queues are
                // never touched.
                config.table = switchyard::Identifier::table(
                    "QUEUE_TABLE",
                    format!("bench_{}", &Uuid::new_v4().simple().to_string()[..12]),
                )?;
            }
        }
        Ok(Target {
            config,
            _dir: dir,
            #[cfg(feature = "postgres")]
            pg: Mutex::default(),
            #[cfg(feature = "mysql")]
            mysql: Mutex::default(),
            #[cfg(feature = "amqp")]
            amqp: Mutex::default(),
        })
    }

    /// A transport on the store; `pool` sizes a PostgreSQL pool for that many
    /// concurrent callers.
    async fn open(&self, pool: Option<u32>) -> Result<Arc<dyn Transport>> {
        Ok(self.open_jobs(pool).await?.transport().clone())
    }

    /// A transport on the store and its status store, where it keeps one.
    async fn open_jobs(&self, pool: Option<u32>) -> Result<Jobs> {
        #[cfg(feature = "amqp")]
        if self.config.backend == BackendKind::RabbitMq {
            // Should the bench be killed, its queues go after an idle hour.
            let options = switchyard::AmqpOptions::from_config(&self.config)
                .with_queue_expires(Duration::from_secs(3600));
            let t = Arc::new(switchyard::AmqpTransport::connect(options).await?);
            if let Ok(mut amqp) = self.amqp.lock() {
                amqp.push(t.clone());
            }
            return Ok(Jobs::new(t, None));
        }
        #[cfg(feature = "postgres")]
        if matches!(
            self.config.database_url.scheme().as_str(),
            "postgres" | "postgresql"
        ) {
            let mut options = switchyard::PgOptions::from_config(&self.config);
            if let Some(n) = pool {
                options = options.with_max_connections(n);
            }
            let t = Arc::new(switchyard::PgTransport::connect(options).await?);
            if let Ok(mut pg) = self.pg.lock() {
                pg.push(t.clone());
            }
            let status = t.status_store();
            return Ok(Jobs::new(t, Some(status)));
        }
        #[cfg(feature = "mysql")]
        if matches!(
            self.config.database_url.scheme().as_str(),
            "mysql" | "mariadb"
        ) {
            let mut options = switchyard::MySqlOptions::from_config(&self.config);
            if let Some(n) = pool {
                options = options.with_max_connections(n);
            }
            let t = Arc::new(switchyard::MySqlTransport::connect(options).await?);
            if let Ok(mut my) = self.mysql.lock() {
                my.push(t.clone());
            }
            let status = t.status_store();
            return Ok(Jobs::new(t, Some(status)));
        }
        let _ = pool;
        switchyard::connect_jobs(&self.config).await
    }

    /// The transport that publishes in the pickup measurement: on a server one of its
    /// own, as another process would be, so the worker is woken by `NOTIFY` (PostgreSQL)
    /// or polling (MySQL); on SQLite the worker's own (an embedded database's publishers
    /// share its process).
    async fn publisher(&self, worker_side: &Arc<dyn Transport>) -> Result<Arc<dyn Transport>> {
        if matches!(worker_side.name(), "postgres" | "mysql" | "amqp") {
            self.open(None).await
        } else {
            Ok(worker_side.clone())
        }
    }

    /// The claim's plan (PostgreSQL).
    async fn claim_plan(&self, q: &QueueName) -> Option<String> {
        #[cfg(feature = "postgres")]
        {
            let t = self.pg.lock().ok()?.first()?.clone();
            return t.explain_claim(q, 64).await.ok();
        }
        #[allow(unreachable_code)]
        {
            let _ = q;
            None
        }
    }

    /// Optimistic claims racing each other (PostgreSQL only; elsewhere `None`).
    async fn contention(&self, reservers: usize, messages: usize) -> Result<Option<Contention>> {
        #[cfg(feature = "postgres")]
        {
            if !matches!(
                self.config.database_url.scheme().as_str(),
                "postgres" | "postgresql"
            ) {
                return Ok(None);
            }
            let t = self
                .open(Some(u32::try_from(reservers + 2).unwrap_or(u32::MAX)))
                .await?;
            let pg = self
                .pg
                .lock()
                .ok()
                .and_then(|pg| pg.last().cloned())
                .ok_or_else(|| Error::InvalidInput("bench: no PostgreSQL transport".into()))?;
            let q = queue("contention")?;
            for chunk in jobs(&q, messages)?.chunks(1_000) {
                t.publish_batch(chunk.to_vec()).await?;
            }
            let before = pg.claim_counters();
            let started = Instant::now();
            let tasks: Vec<_> = (0..reservers)
                .map(|_| {
                    let (t, q) = (t.clone(), q.clone());
                    tokio::spawn(async move {
                        loop {
                            let batch = t.reserve_batch(&q, 10).await?;
                            if batch.is_empty() {
                                return Ok::<(), Error>(());
                            }
                            t.ack_batch(&batch).await?;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await
                    .map_err(|e| Error::InvalidInput(format!("reserver failed: {e}")))??;
            }
            let elapsed = started.elapsed();
            let after = pg.claim_counters();
            let requested = after.requested - before.requested;
            let wasted = after.wasted - before.wasted;
            return Ok(Some(Contention {
                reservers,
                jobs_per_s: messages as f64 / elapsed.as_secs_f64(),
                wasted_claim_ratio: if requested == 0 {
                    0.0
                } else {
                    wasted as f64 / requested as f64
                },
                conflicts: after.conflicts - before.conflicts,
            }));
        }
        #[allow(unreachable_code)]
        {
            let _ = (reservers, messages);
            Ok(None)
        }
    }

    /// Drops the run's tables or queues (a SQLite file goes with its directory).
    async fn cleanup(&self) {
        #[cfg(feature = "amqp")]
        {
            let amqp: Vec<_> = self
                .amqp
                .lock()
                .map(|mut amqp| amqp.drain(..).collect())
                .unwrap_or_default();
            for t in amqp {
                for q in t.queues() {
                    if let Ok(q) = QueueName::new(q) {
                        if let Err(err) = t.delete_queue(&q).await {
                            errln!("bench: could not delete the benchmark queue {q}: {err}");
                        }
                    }
                }
                t.close().await;
            }
        }
        #[cfg(feature = "postgres")]
        {
            let pg: Vec<_> = self
                .pg
                .lock()
                .map(|mut pg| pg.drain(..).collect())
                .unwrap_or_default();
            if let Some(t) = pg.first() {
                if let Err(err) = t.drop_store().await {
                    errln!("bench: could not drop the benchmark tables: {err}");
                }
            }
            for t in pg {
                t.close().await;
            }
        }
        #[cfg(feature = "mysql")]
        {
            let my: Vec<_> = self
                .mysql
                .lock()
                .map(|mut my| my.drain(..).collect())
                .unwrap_or_default();
            if let Some(t) = my.first() {
                if let Err(err) = t.drop_store().await {
                    errln!("bench: could not drop the benchmark tables: {err}");
                }
            }
            for t in my {
                t.close().await;
            }
        }
    }
}

/// Messages published one by one: a tenth of the batch, 100 to 2,000.
fn single_count(messages: usize) -> usize {
    (messages / 10).clamp(100, 2_000)
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

async fn measure(
    target: &Target,
    t: &Arc<dyn Transport>,
    status: Option<&Arc<dyn StatusStore>>,
    args: &BenchArgs,
) -> Result<(Sample, Option<String>)> {
    // Enqueue one by one: one commit each.
    let single_n = single_count(args.messages);
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

    let (drain_per_s, mut duplicates, mut missing) =
        drain(t, &q, &ids, args.concurrency, None).await?;

    // The same with job status: recorded `pending` as published, then `running` and
    // `completed` by the worker.
    let mut drain_status_per_s = None;
    if let Some(store) = status.cloned() {
        let q = queue("status")?;
        let envs = jobs(&q, args.messages)?;
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        let tracked = switchyard::Jobs::new(t.clone(), Some(store.clone()));
        for chunk in envs.chunks(PUBLISH_BATCH) {
            tracked.publish_batch(chunk.to_vec()).await?;
        }
        let (per_s, dups, miss) = drain(t, &q, &ids, args.concurrency, Some(store)).await?;
        drain_status_per_s = Some(per_s);
        duplicates += dups;
        missing += miss;
    }

    // The same drain with `depth` more messages queued behind the measured ones.
    let mut drain_deep_per_s = None;
    let mut plan = None;
    if args.depth > 0 {
        let q = queue("deep")?;
        let measured = jobs(&q, args.messages)?;
        let ids: Vec<Uuid> = measured.iter().map(|e| e.id).collect();
        for chunk in measured.chunks(1_000) {
            t.publish_batch(chunk.to_vec()).await?;
        }
        let mut left = args.depth;
        while left > 0 {
            let n = left.min(1_000);
            t.publish_batch(jobs(&q, n)?).await?;
            left -= n;
        }
        plan = target.claim_plan(&q).await;
        let (per_s, dups, miss) = drain(t, &q, &ids, args.concurrency, None).await?;
        drain_deep_per_s = Some(per_s);
        duplicates += dups;
        missing += miss;
    }

    let publisher = target.publisher(t).await?;
    let (pickup_p50_ms, pickup_p99_ms) = pickup(t, &publisher).await?;
    Ok((
        Sample {
            enqueue_single_per_s,
            enqueue_batch_per_s,
            drain_per_s,
            drain_deep_per_s,
            drain_status_per_s,
            pickup_p50_ms,
            pickup_p99_ms,
            duplicates,
            missing,
        },
        plan,
    ))
}

/// Drains with the worker runtime (batched claims, coalesced acks) and a no-op handler,
/// timed until every measured job has been handled (anything queued behind them stays).
async fn drain(
    t: &Arc<dyn Transport>,
    q: &QueueName,
    ids: &[Uuid],
    concurrency: usize,
    status: Option<Arc<dyn switchyard::StatusStore>>,
) -> Result<(f64, u64, u64)> {
    let seen: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
    let finished: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = CancellationToken::new();
    // Only the measured jobs count: with a backlog behind them, a few of it may be
    // handled before the last measured ones (claims overlap).
    let measured: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
    let handled_measured = std::sync::atomic::AtomicUsize::new(0);
    let (record, done, stopper, total) = (seen.clone(), finished.clone(), stop.clone(), ids.len());
    let options = WorkerOptions::default()
        .with_concurrency(concurrency)
        .with_poll(Duration::from_millis(1), Duration::from_millis(10))
        .with_drain(true);
    let mut worker = Worker::new(t.clone(), q.clone(), options);
    if let Some(store) = status {
        worker = worker.with_status(store);
    }
    let worker = worker.handle(
        "noop",
        handler_fn(move |ctx: JobContext| {
            if let Ok(mut seen) = record.lock() {
                let count = seen.entry(ctx.envelope.id).or_default();
                *count += 1;
                if *count == 1
                    && measured.contains(&ctx.envelope.id)
                    && handled_measured.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
                        == total
                {
                    if let Ok(mut done) = done.lock() {
                        done.get_or_insert_with(Instant::now);
                    }
                    stopper.cancel();
                }
            }
            async { Ok(()) }
        }),
    );
    let started = Instant::now();
    worker.run(stop).await?;
    let elapsed = finished
        .lock()
        .ok()
        .and_then(|f| *f)
        .unwrap_or_else(Instant::now)
        .duration_since(started);
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
async fn pickup(t: &Arc<dyn Transport>, publisher: &Arc<dyn Transport>) -> Result<(f64, f64)> {
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
        publisher.publish(env).await?;
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
        depth: args.depth,
        summary: Sample {
            enqueue_single_per_s: m(|s| s.enqueue_single_per_s),
            enqueue_batch_per_s: m(|s| s.enqueue_batch_per_s),
            drain_per_s: m(|s| s.drain_per_s),
            drain_deep_per_s: samples
                .iter()
                .map(|s| s.drain_deep_per_s)
                .collect::<Option<Vec<f64>>>()
                .map(median),
            drain_status_per_s: samples
                .iter()
                .map(|s| s.drain_status_per_s)
                .collect::<Option<Vec<f64>>>()
                .map(median),
            pickup_p50_ms: m(|s| s.pickup_p50_ms),
            pickup_p99_ms: m(|s| s.pickup_p99_ms),
            duplicates: samples.iter().map(|s| s.duplicates).sum(),
            missing: samples.iter().map(|s| s.missing).sum(),
        },
        samples,
        claim_plan: None,
        contention: Vec::new(),
        baseline: None,
    }
}
