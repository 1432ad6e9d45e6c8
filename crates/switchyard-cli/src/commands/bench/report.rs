//! What a bench reports: each run's sample, the medians over the runs, the baseline's
//! ratios, and the table printed for people.

use serde::Serialize;

use super::baseline::Baseline;
use super::processes::ProcessDrain;
use crate::cli::BenchArgs;
use switchyard::ClaimStrategy;

#[derive(Debug, Clone, Serialize)]
pub(super) struct Sample {
    pub(super) enqueue_single_per_s: f64,
    pub(super) enqueue_batch_per_s: f64,
    pub(super) drain_per_s: f64,
    /// The same drain with `--depth` more messages queued behind the measured ones.
    pub(super) drain_deep_per_s: Option<f64>,
    /// The same drain recording each job's status (published `pending` through `Jobs`,
    /// then `running` and `completed`), where the backend keeps status.
    pub(super) drain_status_per_s: Option<f64>,
    /// The same drain of messages with ordering keys (1,000 keys, one message of each
    /// key at a time), where the backend keeps their order.
    pub(super) drain_keyed_per_s: Option<f64>,
    /// The same drain of labelled jobs by a worker claiming only that label.
    pub(super) drain_labels_per_s: Option<f64>,
    /// The same drain under a per-key concurrency limit (`features::LIMIT_KEYS` keys,
    /// `LIMIT_CONCURRENCY` of a key at once), where the backend keeps limits.
    pub(super) drain_limited_per_s: Option<f64>,
    /// The batched publish and the drain of jobs with a unique key each, where the
    /// backend keeps unique keys.
    pub(super) enqueue_unique_per_s: Option<f64>,
    pub(super) drain_unique_per_s: Option<f64>,
    pub(super) pickup_p50_ms: f64,
    pub(super) pickup_p99_ms: f64,
    /// Pickup with the publisher in another process (`switchyard bench-publish`).
    pub(super) pickup_process_p50_ms: f64,
    pub(super) pickup_process_p99_ms: f64,
    /// The drains with the worker in other processes, per number of processes.
    pub(super) drain_processes: Vec<ProcessDrain>,
    pub(super) duplicates: u64,
    pub(super) missing: u64,
}

/// Optimistic claims racing each other: bare reservers (reserve 10, ack 10, repeat).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Contention {
    pub(super) reservers: usize,
    pub(super) jobs_per_s: f64,
    /// Rows a competitor took between an optimistic claim's read and its compare-and-set,
    /// over the rows it tried to take.
    pub(super) wasted_claim_ratio: f64,
    /// Claim statements that lost a deadlock and ran again.
    pub(super) conflicts: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) backend: String,
    pub(super) claim: String,
    /// What woke the idle worker in the pickup measurement.
    pub(super) wake: String,
    pub(super) runs: usize,
    pub(super) messages: usize,
    pub(super) concurrency: usize,
    /// Messages queued behind the measured ones in the deep drain.
    pub(super) depth: usize,
    /// Medians over the runs; duplicates and missing are totals, and both must be 0.
    #[serde(flatten)]
    pub(super) summary: Sample,
    pub(super) samples: Vec<Sample>,
    /// The claim's plan at the deep drain's depth (PostgreSQL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) claim_plan: Option<String>,
    /// Medians over the runs, per number of reservers (optimistic claims on PostgreSQL).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) contention: Vec<Contention>,
    /// Bare SQL or bare lapin on the same server or file, measured once in each run:
    /// medians, and the medians of each run's ratios of the queue to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) baseline: Option<BaselineReport>,
}

#[derive(Debug, Serialize)]
pub(super) struct BaselineReport {
    #[serde(flatten)]
    pub(super) median: Baseline,
    pub(super) enqueue_single_ratio: f64,
    pub(super) enqueue_batch_ratio: f64,
    pub(super) drain_ratio: f64,
    /// The queue's pickup p50 (publisher in the same process, as the bare one) over the
    /// bare consumer's, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) pickup_ratio: Option<f64>,
}

/// Medians of the baseline runs and of each run's ratios (`samples[i]` ran beside
/// `bare[i]`).
pub(super) fn baseline_report(samples: &[Sample], bare: &[Baseline]) -> Option<BaselineReport> {
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
            pickup_p50_ms: bare
                .iter()
                .map(|b| b.pickup_p50_ms)
                .collect::<Option<Vec<f64>>>()
                .map(median),
            pickup_p99_ms: bare
                .iter()
                .map(|b| b.pickup_p99_ms)
                .collect::<Option<Vec<f64>>>()
                .map(median),
        },
        enqueue_single_ratio: ratio(|s| s.enqueue_single_per_s, |b| b.insert_single_per_s),
        enqueue_batch_ratio: ratio(|s| s.enqueue_batch_per_s, |b| b.insert_batch_per_s),
        drain_ratio: ratio(|s| s.drain_per_s, |b| b.drain_per_s),
        pickup_ratio: samples
            .iter()
            .zip(bare)
            .map(|(s, b)| {
                b.pickup_p50_ms
                    .map(|p| s.pickup_p50_ms / p.max(f64::MIN_POSITIVE))
            })
            .collect::<Option<Vec<f64>>>()
            .map(median),
    })
}

/// The median of each reserver count's runs.
pub(super) fn median_contention(reservers: &[usize], runs: &[Vec<Contention>]) -> Vec<Contention> {
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

/// The median of each number of worker processes' drains.
fn median_process_drains(samples: &[Sample]) -> Vec<ProcessDrain> {
    let Some(first) = samples.first() else {
        return Vec::new();
    };
    first
        .drain_processes
        .iter()
        .map(|d| d.processes)
        .map(|n| {
            let of_n: Vec<&ProcessDrain> = samples
                .iter()
                .flat_map(|s| s.drain_processes.iter().filter(|d| d.processes == n))
                .collect();
            let ratios: Option<Vec<f64>> = of_n.iter().map(|d| d.wasted_claim_ratio).collect();
            let conflicts: Option<Vec<u64>> = of_n.iter().map(|d| d.conflicts).collect();
            ProcessDrain {
                processes: n,
                per_s: median(of_n.iter().map(|d| d.per_s).collect()),
                wasted_claim_ratio: ratios.map(median),
                conflicts: conflicts.map(|c| median(c.iter().map(|&n| n as f64).collect()) as u64),
                duplicates: of_n.iter().map(|d| d.duplicates).sum(),
                missing: of_n.iter().map(|d| d.missing).sum(),
            }
        })
        .collect()
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub(super) fn summarise(
    backend: String,
    wake: String,
    claim: ClaimStrategy,
    args: &BenchArgs,
    samples: Vec<Sample>,
) -> Report {
    let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    // A measurement that some run lacks has no median.
    let some = |f: fn(&Sample) -> Option<f64>| {
        samples
            .iter()
            .map(f)
            .collect::<Option<Vec<f64>>>()
            .map(median)
    };
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
            drain_deep_per_s: some(|s| s.drain_deep_per_s),
            drain_status_per_s: some(|s| s.drain_status_per_s),
            drain_keyed_per_s: some(|s| s.drain_keyed_per_s),
            drain_labels_per_s: some(|s| s.drain_labels_per_s),
            drain_limited_per_s: some(|s| s.drain_limited_per_s),
            enqueue_unique_per_s: some(|s| s.enqueue_unique_per_s),
            drain_unique_per_s: some(|s| s.drain_unique_per_s),
            pickup_p50_ms: m(|s| s.pickup_p50_ms),
            pickup_p99_ms: m(|s| s.pickup_p99_ms),
            pickup_process_p50_ms: m(|s| s.pickup_process_p50_ms),
            pickup_process_p99_ms: m(|s| s.pickup_process_p99_ms),
            drain_processes: median_process_drains(&samples),
            duplicates: samples.iter().map(|s| s.duplicates).sum(),
            missing: samples.iter().map(|s| s.missing).sum(),
        },
        samples,
        claim_plan: None,
        contention: Vec::new(),
        baseline: None,
    }
}

/// Prints the reports as a table, then what the table has no columns for.
pub(super) fn print(reports: &[Report], args: &BenchArgs) {
    print_table(reports, args);
    print_notes(reports);
    print_baselines(reports);
    if let Some(plan) = reports.iter().find_map(|r| r.claim_plan.as_ref()) {
        outln!("claim plan at the deep drain's depth:\n{plan}");
    }
}

/// One row per backend and claim: the medians.
fn print_table(reports: &[Report], args: &BenchArgs) {
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
    for r in reports {
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
}

/// The drains with status and at depth, and the optimistic claims' contention.
fn print_notes(reports: &[Report]) {
    for r in reports {
        outln!(
            "{} {}: pickup with the publisher in another process: p50 {:.1} ms, p99 {:.1} ms",
            r.backend,
            r.claim,
            r.summary.pickup_process_p50_ms,
            r.summary.pickup_process_p99_ms
        );
        if let Some(tracked) = r.summary.drain_status_per_s {
            outln!(
                "{} {}: drain recording job status: {tracked:.0} jobs/s ({:.0}% of the plain drain)",
                r.backend,
                r.claim,
                100.0 * tracked / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
            );
        }
        if let Some(keyed) = r.summary.drain_keyed_per_s {
            outln!(
                "{} {}: drain with ordering keys ({} keys, one message of a key at a time): {keyed:.0} jobs/s ({:.0}% of the unordered drain)",
                r.backend,
                r.claim,
                super::workload::ORDERING_KEYS,
                100.0 * keyed / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
            );
        }
        print_feature_costs(r);
        if let Some(deep) = r.summary.drain_deep_per_s {
            outln!(
                "{} {}: drain with {} more queued behind: {deep:.0} jobs/s ({:.0}% of the shallow drain)",
                r.backend,
                r.claim,
                r.depth,
                100.0 * deep / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
            );
        }
        for d in &r.summary.drain_processes {
            let wasted = d.wasted_claim_ratio.map_or(String::new(), |w| {
                format!(
                    ", wasted-claim ratio {w:.3}, {} conflicts retried",
                    d.conflicts.unwrap_or(0)
                )
            });
            outln!(
                "{} {}: drain by {} worker process{} of {} slots: {:.0} jobs/s ({:.0}% of the in-process drain){wasted}",
                r.backend,
                r.claim,
                d.processes,
                if d.processes == 1 { "" } else { "es" },
                r.concurrency,
                d.per_s,
                100.0 * d.per_s / r.summary.drain_per_s.max(f64::MIN_POSITIVE)
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
}

/// The drains with a label filter, a limit and unique keys, beside the plain drain.
fn print_feature_costs(r: &Report) {
    let plain = r.summary.drain_per_s.max(f64::MIN_POSITIVE);
    let limited = format!(
        "drain under a per-key concurrency limit ({} keys, {} of a key at once)",
        super::features::LIMIT_KEYS,
        super::features::LIMIT_CONCURRENCY
    );
    let rows = [
        (
            "drain with a label filter",
            r.summary.drain_labels_per_s,
            plain,
        ),
        (limited.as_str(), r.summary.drain_limited_per_s, plain),
        (
            "batched publish with a unique key each",
            r.summary.enqueue_unique_per_s,
            r.summary.enqueue_batch_per_s.max(f64::MIN_POSITIVE),
        ),
        (
            "drain with a unique key each",
            r.summary.drain_unique_per_s,
            plain,
        ),
    ];
    for (what, per_s, beside) in rows {
        if let Some(per_s) = per_s {
            outln!(
                "{} {}: {what}: {per_s:.0} jobs/s ({:.0}% of the plain one)",
                r.backend,
                r.claim,
                100.0 * per_s / beside
            );
        }
    }
}

/// The bare baseline of the same runs, and the queue's ratios to it.
fn print_baselines(reports: &[Report]) {
    for r in reports {
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
            if let (Some(p50), Some(p99), Some(ratio)) = (
                b.median.pickup_p50_ms,
                b.median.pickup_p99_ms,
                b.pickup_ratio,
            ) {
                outln!(
                    "{} {}: pickup of a bare {} in the same runs: p50 {:.1} ms, p99 {:.1} ms; \
                     the queue's (publisher in the same process) is {:.2} times it",
                    r.backend,
                    r.claim,
                    if r.backend == "amqp" {
                        "lapin consumer"
                    } else {
                        "LISTEN and one claim"
                    },
                    p50,
                    p99,
                    ratio
                );
            }
        }
    }
}
