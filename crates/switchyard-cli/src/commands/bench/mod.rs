//! `switchyard bench`: enqueue (one by one and batched), drain at a fixed concurrency
//! with a no-op handler, and pickup latency, per backend and claim strategy. Every job
//! is checked off: the report counts duplicates and missing jobs.
//!
//! This module runs the measurements in order; `target` provisions a fresh store per
//! run, `measure` measures, `report` summarises and prints, `baseline` measures
//! bare SQL or bare lapin on the same server for ratios, and `floor` the pickup of a bare
//! consumer there.

mod baseline;
mod features;
#[cfg(any(feature = "postgres", feature = "amqp"))]
mod floor;
mod measure;
mod processes;
mod remote;
mod report;
mod target;
mod workload;

use switchyard::{
    BackendKind, ClaimStrategy, Config, Envelope, Jobs, QueueName, Result, Transport,
};

use crate::cli::BenchArgs;
use baseline::{Bare, Baseline};
use report::{baseline_report, median_contention, summarise, Contention, Report, Sample};
use target::Target;
use workload::{jobs, queue, single_count};

pub(crate) use processes::drain_in_process;
pub(crate) use remote::publish_timed;

pub(crate) async fn run(config: &Config, args: BenchArgs, json: bool) -> Result<()> {
    let claims = match args.only_claim.as_deref() {
        // A broker has no claim strategy to compare.
        _ if config.backend == BackendKind::RabbitMq => vec![ClaimStrategy::SkipLocked],
        Some(c) => vec![c.parse::<ClaimStrategy>()?],
        None => vec![ClaimStrategy::SkipLocked, ClaimStrategy::Optimistic],
    };
    let mut reports = Vec::new();
    for claim in claims {
        reports.push(bench_claim(config, &args, json, claim).await?);
    }
    if json {
        return crate::output::json_line(&serde_json::json!({ "results": reports }));
    }
    report::print(&reports, &args);
    Ok(())
}

/// What the runs of one claim strategy gathered.
#[derive(Default)]
struct Runs {
    samples: Vec<Sample>,
    contention: Vec<Vec<Contention>>,
    backend: String,
    wake: String,
    claim_plan: Option<String>,
    bare: Vec<Baseline>,
}

/// Every run of one claim strategy, summarised.
async fn bench_claim(
    config: &Config,
    args: &BenchArgs,
    json: bool,
    claim: ClaimStrategy,
) -> Result<Report> {
    let mut runs = Runs::default();
    for run in 0..args.runs.max(1) {
        one_run(config, args, json, claim, run, &mut runs).await?;
    }
    let mut report = summarise(runs.backend, runs.wake, claim, args, runs.samples);
    if config.backend == BackendKind::RabbitMq {
        report.claim = "consumer".into();
    }
    report.claim_plan = runs.claim_plan;
    report.contention = median_contention(&args.reservers, &runs.contention);
    report.baseline = baseline_report(&report.samples, &runs.bare);
    Ok(report)
}

/// One run on a fresh store: the measurements, the optimistic claims' contention, and
/// the baseline beside them.
async fn one_run(
    config: &Config,
    args: &BenchArgs,
    json: bool,
    claim: ClaimStrategy,
    run: usize,
    runs: &mut Runs,
) -> Result<()> {
    // Made before the run's store, whose tables an error would leave behind.
    let singles: Vec<String> = match args.baseline {
        true => jobs(&queue("bare")?, single_count(args.messages))?
            .iter()
            .map(Envelope::to_json)
            .collect(),
        false => Vec::new(),
    };
    let target = Target::new(config, claim)?;
    let opened = target.open_jobs(None).await?;
    let t = opened.transport().clone();
    runs.backend = t.name().to_owned();
    runs.wake = wake_source(t.as_ref()).to_owned();
    if !json {
        let claim = if config.backend == BackendKind::RabbitMq {
            "consumer".to_owned()
        } else {
            claim.to_string()
        };
        errln!(
            "bench: {} {claim} run {}/{}",
            runs.backend,
            run + 1,
            args.runs.max(1)
        );
    }
    // On the target's server or file (on SQLite the bench's own temporary file, so the
    // user's database is never touched), open before the run's warm-up, which it takes
    // part in, and the queue's batched publish, whose batches its inserts take turns with.
    let bare = match args.baseline {
        true => Bare::open(target.config(), args.concurrency).await,
        false => Ok(None),
    };
    let mut bare = match bare {
        Ok(bare) => bare,
        Err(err) => {
            target.cleanup().await;
            return Err(err);
        }
    };
    let measured = measure_run(&target, &opened, args, claim, bare.as_mut(), &singles, runs).await;
    target.cleanup().await;
    if let Err(err) = measured {
        if let Some(bare) = bare {
            bare.discard().await;
        }
        return Err(err);
    }
    if let Some(bare) = bare {
        runs.bare.push(bare.measure(args.concurrency).await?);
    }
    Ok(())
}

/// The queue's measurements of one run, and the optimistic claims' contention; the
/// baseline's inserts beside them, of `singles` one by one and then in turns.
async fn measure_run(
    target: &Target,
    opened: &Jobs,
    args: &BenchArgs,
    claim: ClaimStrategy,
    bare: Option<&mut Bare>,
    singles: &[String],
    runs: &mut Runs,
) -> Result<()> {
    let (sample, plan) = measure::measure(target, opened, args, bare, singles).await?;
    runs.claim_plan = plan.or(runs.claim_plan.take());
    runs.samples.push(sample);
    if claim == ClaimStrategy::Optimistic {
        let mut per_run = Vec::new();
        for &n in &args.reservers {
            if let Some(c) = target.contention(n, args.messages).await? {
                per_run.push(c);
            }
        }
        runs.contention.push(per_run);
    }
    Ok(())
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
