//! One run's measurements: enqueue one by one and in batches, drains (plain, with job
//! status, with ordering keys, at depth, by worker processes) with the worker runtime,
//! and pickup latency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use switchyard::{
    CancellationToken, Envelope, Error, Jobs, QueueName, Result, StatusStore, Transport,
    TransportExt,
};
use uuid::Uuid;

use super::baseline::Bare;
use super::report::Sample;
use super::target::Target;
use super::workload::{
    jobs, keyed_jobs, percentiles, queue, rate, single_count, PICKUP_INTERVAL, PICKUP_MESSAGES,
};
use super::{processes, remote};
use crate::cli::BenchArgs;

/// Messages per batched publish.
const PUBLISH_BATCH: usize = 100;
/// Jobs published and drained, untimed, before anything is timed (see
/// [`Drains::warm_up`]).
const WARM_UP: usize = 5_000;

/// Measures one run on `t` (and its status store, where it keeps one), and the
/// baseline's inserts beside it: `singles` one by one, then in turns with the batched
/// publish; the claim's plan at depth where `--depth` asked for it (PostgreSQL).
pub(super) async fn measure(
    target: &Target,
    opened: &Jobs,
    args: &BenchArgs,
    mut bare: Option<&mut Bare>,
    singles: &[String],
) -> Result<(Sample, Option<String>)> {
    let (t, status) = (opened.transport(), opened.store());
    let mut drains = Drains {
        t,
        concurrency: args.concurrency,
        duplicates: 0,
        missing: 0,
    };
    let q = queue("warm")?;
    let warm = jobs(&q, WARM_UP.min(args.messages))?;
    if let Some(b) = bare.as_deref_mut() {
        let rows: Vec<String> = warm.iter().map(Envelope::to_json).collect();
        drains.warm_up(&q, warm).await?;
        b.warm_up(&rows).await?;
        // Just before the queue's single publishes, both into tables warmed alike.
        b.insert_singles(singles).await?;
    } else {
        drains.warm_up(&q, warm).await?;
    }

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
    let (ids, enqueue_batch_per_s) = drains.publish(&q, envs, bare).await?;
    let drain_per_s = drains.run(&q, &ids, With::default()).await?;
    let drain_status_per_s = match status {
        Some(store) => Some(drains.with_status(store, args.messages).await?),
        None => None,
    };
    let drain_keyed_per_s = if t.capabilities().ordering_keys {
        Some(drains.keyed(args.messages).await?)
    } else {
        None
    };
    let costs = drains.features(status, args.messages).await?;
    let (drain_deep_per_s, plan) = match args.depth {
        0 => (None, None),
        depth => {
            let (per_s, plan) = drains.deep(target, args.messages, depth).await?;
            (Some(per_s), plan)
        }
    };
    let Drains {
        mut duplicates,
        mut missing,
        ..
    } = drains;
    let drain_processes = processes::drains(target.config(), t, args).await?;
    for d in &drain_processes {
        duplicates += d.duplicates;
        missing += d.missing;
    }

    let publisher = target.publisher(t).await?;
    let (pickup_p50_ms, pickup_p99_ms) = pickup(t, Publisher::Here(publisher)).await?;
    let (pickup_process_p50_ms, pickup_process_p99_ms) =
        pickup(t, Publisher::Process(target.config())).await?;
    Ok((
        Sample {
            enqueue_single_per_s,
            enqueue_batch_per_s,
            drain_per_s,
            drain_deep_per_s,
            drain_status_per_s,
            drain_keyed_per_s,
            drain_labels_per_s: costs.drain_labels_per_s,
            drain_limited_per_s: costs.drain_limited_per_s,
            enqueue_unique_per_s: costs.enqueue_unique_per_s,
            drain_unique_per_s: costs.drain_unique_per_s,
            pickup_p50_ms,
            pickup_p99_ms,
            pickup_process_p50_ms,
            pickup_process_p99_ms,
            drain_processes,
            duplicates,
            missing,
        },
        plan,
    ))
}

/// The drains of one run, and the duplicates and missing jobs they saw.
pub(super) struct Drains<'a> {
    /// The transport drained.
    pub(super) t: &'a Arc<dyn Transport>,
    /// Handler slots of each drain's worker.
    pub(super) concurrency: usize,
    /// Jobs handled more than once, and jobs never handled, over every drain.
    pub(super) duplicates: u64,
    pub(super) missing: u64,
}

/// What a drain's worker runs with beyond the plain drain.
#[derive(Default)]
pub(super) struct With {
    /// Records job status in this store.
    pub(super) status: Option<Arc<dyn StatusStore>>,
    /// Claims only jobs with one of these labels.
    pub(super) labels: Vec<String>,
    /// Holds to these limits.
    pub(super) limits: Vec<switchyard::Limit>,
    /// Where the limits' slots are kept.
    pub(super) limit_store: Option<Arc<dyn switchyard::LimitStore>>,
}

impl With {
    fn status(store: Arc<dyn StatusStore>) -> Self {
        With {
            status: Some(store),
            ..With::default()
        }
    }
}

impl Drains<'_> {
    /// Publishes `envs` on `q` in batches of [`PUBLISH_BATCH`], taking turns with the
    /// bare baseline's inserts of the same rows where there is one (which goes first
    /// alternates); their ids and the publish's rate.
    pub(super) async fn publish(
        &self,
        q: &QueueName,
        envs: Vec<Envelope>,
        mut bare: Option<&mut Bare>,
    ) -> Result<(Vec<Uuid>, f64)> {
        let ids = envs.iter().map(|e| e.id).collect();
        let rows: Vec<String> = match bare {
            Some(_) => envs.iter().map(Envelope::to_json).collect(),
            None => Vec::new(),
        };
        let mut batches = Vec::with_capacity(envs.len().div_ceil(PUBLISH_BATCH));
        let mut envs = envs.into_iter().peekable();
        while envs.peek().is_some() {
            batches.push(envs.by_ref().take(PUBLISH_BATCH).collect::<Vec<_>>());
        }
        let (mut published, mut took) = (0, Duration::ZERO);
        for (i, batch) in batches.into_iter().enumerate() {
            let bare_rows = rows.get(published..published + batch.len());
            published += batch.len();
            let bare_first = i % 2 == 1;
            if let (true, Some(bare), Some(rows)) = (bare_first, bare.as_deref_mut(), bare_rows) {
                bare.insert_batch(q.as_str(), rows).await?;
            }
            let started = Instant::now();
            self.t.publish_batch(batch).await?;
            took += started.elapsed();
            if let (false, Some(bare), Some(rows)) = (bare_first, bare.as_deref_mut(), bare_rows) {
                bare.insert_batch(q.as_str(), rows).await?;
            }
        }
        Ok((ids, rate(published, took)))
    }

    /// Publishes and drains `envs` on `q` untimed, first in the run: on PostgreSQL a
    /// transport's first drain ran slower than later ones, and every drain after it looked
    /// faster beside it. Run right before the timed plain drain, as it once was, it slowed
    /// that drain on MariaDB (InnoDB purging the drained rows, presumably), and the status
    /// shares read high (`docs/benchmarks.md`, 2026-11-28 and 2026-11-29). First in the
    /// run, beside the baseline's own warm-up ([`Bare::warm_up`]), it leaves every timed
    /// step after the same untimed work on both sides.
    async fn warm_up(&mut self, q: &QueueName, envs: Vec<Envelope>) -> Result<()> {
        self.publish_and_drain(q, envs).await?;
        Ok(())
    }

    /// Publishes `envs` on `q` untimed, 1,000 at a time, then drains them plainly.
    async fn publish_and_drain(&mut self, q: &QueueName, envs: Vec<Envelope>) -> Result<f64> {
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        for chunk in envs.chunks(1_000) {
            self.t.publish_batch(chunk.to_vec()).await?;
        }
        self.run(q, &ids, With::default()).await
    }

    /// Drains `ids` from `q` (see [`drain`]), counting what went wrong.
    pub(super) async fn run(&mut self, q: &QueueName, ids: &[Uuid], with: With) -> Result<f64> {
        let (per_s, duplicates, missing) = drain(self.t, q, ids, self.concurrency, with).await?;
        self.duplicates += duplicates;
        self.missing += missing;
        Ok(per_s)
    }

    /// The same with job status: recorded `pending` as published, then `running` and
    /// `completed` by the worker.
    async fn with_status(&mut self, store: &Arc<dyn StatusStore>, n: usize) -> Result<f64> {
        let q = queue("status")?;
        let envs = jobs(&q, n)?;
        let ids: Vec<Uuid> = envs.iter().map(|e| e.id).collect();
        let tracked = switchyard::Jobs::new(self.t.clone(), Some(store.clone()));
        for chunk in envs.chunks(PUBLISH_BATCH) {
            tracked.publish_batch(chunk.to_vec()).await?;
        }
        self.run(&q, &ids, With::status(store.clone())).await
    }

    /// The same with ordering keys: one message of each key at a time.
    async fn keyed(&mut self, n: usize) -> Result<f64> {
        let q = queue("keyed")?;
        self.publish_and_drain(&q, keyed_jobs(&q, n)?).await
    }

    /// The same with `depth` more messages queued behind the measured ones; the claim's
    /// plan at that depth where the target can show it.
    async fn deep(
        &mut self,
        target: &Target,
        n: usize,
        depth: usize,
    ) -> Result<(f64, Option<String>)> {
        let q = queue("deep")?;
        let measured = jobs(&q, n)?;
        let ids: Vec<Uuid> = measured.iter().map(|e| e.id).collect();
        for chunk in measured.chunks(1_000) {
            self.t.publish_batch(chunk.to_vec()).await?;
        }
        let mut left = depth;
        while left > 0 {
            let batch = left.min(1_000);
            self.t.publish_batch(jobs(&q, batch)?).await?;
            left -= batch;
        }
        let plan = target.claim_plan(&q).await;
        Ok((self.run(&q, &ids, With::default()).await?, plan))
    }
}

/// Drains with the worker runtime (batched claims, coalesced acks) and a no-op handler,
/// timed until every measured job has been handled (anything queued behind them stays).
async fn drain(
    t: &Arc<dyn Transport>,
    q: &QueueName,
    ids: &[Uuid],
    concurrency: usize,
    with: With,
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
        .with_drain(true)
        .with_labels(with.labels)
        .with_limits(with.limits);
    let mut worker = Worker::new(t.clone(), q.clone(), options);
    if let Some(store) = with.status {
        worker = worker.with_status(store);
    }
    if let Some(store) = with.limit_store {
        worker = worker.with_limit_store(store);
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

/// Who publishes in the pickup measurement.
pub(super) enum Publisher<'a> {
    /// A transport of this process.
    Here(Arc<dyn Transport>),
    /// Another process (`switchyard bench-publish`) on the store `config` describes.
    Process(&'a switchyard::Config),
}

/// Publishes at a fixed rate to an idle worker (default polling, plus the transport's
/// wake-up signal where it has one) and measures publish → handler start, by the time
/// each job carries.
pub(super) async fn pickup(t: &Arc<dyn Transport>, publisher: Publisher<'_>) -> Result<(f64, f64)> {
    let q = queue("pickup")?;
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let l = latencies.clone();
    let worker = Worker::new(t.clone(), q.clone(), WorkerOptions::default()).handle(
        "noop",
        handler_fn(move |ctx: JobContext| {
            let at = remote::now_ns();
            let sent = ctx
                .envelope
                .headers
                .get(remote::SENT_NS)
                .and_then(|s| s.parse::<i64>().ok());
            // Both clocks are this machine's; a step of it between the two reads would
            // give a negative time, which is dropped rather than counted as 0.
            if let (Some(Ok(ns)), Ok(mut l)) = (sent.map(|s| u64::try_from(at - s)), l.lock()) {
                l.push(Duration::from_nanos(ns));
            }
            async { Ok(()) }
        }),
    );
    let stop = CancellationToken::new();
    // Whatever way this returns, the worker stops.
    let _stop_on_return = stop.clone().drop_guard();
    let running = tokio::spawn(worker.run(stop.clone()));
    // Let the worker fall idle first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    match publisher {
        Publisher::Here(publisher) => {
            let mut tick = tokio::time::interval(PICKUP_INTERVAL);
            for env in jobs(&q, PICKUP_MESSAGES)? {
                tick.tick().await;
                publisher.publish(remote::stamped(env)).await?;
            }
        }
        Publisher::Process(config) => {
            let mut child = remote::spawn(config, q.as_str(), PICKUP_MESSAGES, PICKUP_INTERVAL)?;
            let status = child
                .wait()
                .await
                .map_err(|e| Error::io("waiting for the publisher process", e))?;
            if !status.success() {
                return Err(Error::InvalidInput(format!(
                    "the pickup's publisher process failed ({status})"
                )));
            }
        }
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
    let latencies = latencies
        .lock()
        .map_err(|_| Error::InvalidInput("bench lock poisoned".into()))?
        .clone();
    Ok(percentiles(latencies))
}
