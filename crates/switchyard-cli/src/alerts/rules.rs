//! When `serve` calls something an incident: the thresholds, and what a reading of the
//! queues, the job status and the workers says against them.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use switchyard::status::{Throughput, WorkerInfo};
use switchyard::QueueStats;

/// The settings of `serve --alert-*`; a rule without a threshold is off.
#[derive(Debug, Clone)]
pub(crate) struct Thresholds {
    /// Failed share of the jobs finished in the window, per queue (0 to 1).
    pub(crate) failure_rate: Option<f64>,
    /// Fewer finished jobs than this in the window never make a failure-rate incident.
    pub(crate) min_finished: u64,
    /// The window of the failure rate and of dead-letter growth.
    pub(crate) window: Duration,
    /// A queue's oldest ready message waited longer than this.
    pub(crate) oldest_ready: Option<Duration>,
    /// A queue gained at least this many dead letters within the window.
    pub(crate) dead_growth: Option<u64>,
    /// Messages are ready and no worker of their queue reported for this long.
    pub(crate) no_workers: Option<Duration>,
}

/// The kinds of incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Rule {
    FailureRate,
    OldestReady,
    DeadGrowth,
    NoWorkers,
}

impl Rule {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Rule::FailureRate => "failure rate",
            Rule::OldestReady => "oldest ready message",
            Rule::DeadGrowth => "dead letters growing",
            Rule::NoWorkers => "no workers",
        }
    }
}

/// One incident: a rule broken on one queue.
pub(crate) type Key = (Rule, String);

/// What was read at one moment.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    pub(crate) at: DateTime<Utc>,
    pub(crate) queues: Vec<QueueStats>,
    /// Whether the backend could list its queues (RabbitMQ cannot).
    pub(crate) queues_listed: bool,
    /// Finished jobs per bucket; `None` without a status store.
    pub(crate) throughput: Option<Vec<Throughput>>,
    /// Workers that reported; `None` without a status store.
    pub(crate) workers: Option<Vec<WorkerInfo>>,
}

/// The rules with their memory: dead-letter counts over the window.
#[derive(Debug)]
pub(crate) struct Rules {
    thresholds: Thresholds,
    dead_seen: VecDeque<(DateTime<Utc>, BTreeMap<String, u64>)>,
}

impl Rules {
    pub(crate) fn new(thresholds: Thresholds) -> Self {
        Rules {
            thresholds,
            dead_seen: VecDeque::new(),
        }
    }

    /// The incidents `reading` shows, each with a line that says what and how much.
    pub(crate) fn evaluate(&mut self, reading: &Reading) -> BTreeMap<Key, String> {
        let mut open = BTreeMap::new();
        let th = self.thresholds.clone();
        if let (Some(limit), Some(buckets)) = (th.failure_rate, &reading.throughput) {
            self.failure_rate(limit, buckets, reading.at, &mut open);
        }
        if let Some(limit) = th.oldest_ready {
            for q in &reading.queues {
                if let Some(age) = q.oldest_ready_age.filter(|age| *age >= limit) {
                    open.insert(
                        (Rule::OldestReady, q.queue.clone()),
                        format!(
                            "the oldest ready message of {} has waited {}s (threshold {}s)",
                            q.queue,
                            age.as_secs(),
                            limit.as_secs()
                        ),
                    );
                }
            }
        }
        if let Some(limit) = th.dead_growth {
            self.dead_growth(limit, reading, &mut open);
        }
        if let (Some(limit), Some(workers)) = (th.no_workers, &reading.workers) {
            no_workers(limit, &reading.queues, workers, reading.at, &mut open);
        }
        open
    }

    fn failure_rate(
        &self,
        limit: f64,
        buckets: &[Throughput],
        at: DateTime<Utc>,
        open: &mut BTreeMap<Key, String>,
    ) {
        let since = at - chrono_span(self.thresholds.window);
        let mut per_queue: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for b in buckets.iter().filter(|b| b.at >= since) {
            let e = per_queue.entry(b.queue.as_str()).or_default();
            e.0 += b.completed;
            e.1 += b.failed;
        }
        for (queue, (completed, failed)) in per_queue {
            let finished = completed + failed;
            if finished == 0 || finished < self.thresholds.min_finished {
                continue;
            }
            let rate = failed as f64 / finished as f64;
            if rate >= limit {
                open.insert(
                    (Rule::FailureRate, queue.to_owned()),
                    format!(
                        "{failed} of the {finished} jobs of {queue} finished in the last {}s failed ({:.0}%, threshold {:.0}%)",
                        self.thresholds.window.as_secs(),
                        rate * 100.0,
                        limit * 100.0
                    ),
                );
            }
        }
    }

    fn dead_growth(&mut self, limit: u64, reading: &Reading, open: &mut BTreeMap<Key, String>) {
        let now: BTreeMap<String, u64> = reading
            .queues
            .iter()
            .map(|q| (q.queue.clone(), q.dead))
            .collect();
        let since = reading.at - chrono_span(self.thresholds.window);
        while self.dead_seen.front().is_some_and(|(at, _)| *at < since) {
            self.dead_seen.pop_front();
        }
        if let Some((_, first)) = self.dead_seen.front() {
            for (queue, dead) in &now {
                let before = first.get(queue).copied().unwrap_or(0);
                let grown = dead.saturating_sub(before);
                if grown >= limit {
                    open.insert(
                        (Rule::DeadGrowth, queue.clone()),
                        format!(
                            "{queue} gained {grown} dead letters in the last {}s (threshold {limit}; {dead} in all)",
                            self.thresholds.window.as_secs()
                        ),
                    );
                }
            }
        }
        self.dead_seen.push_back((reading.at, now));
    }
}

fn no_workers(
    limit: Duration,
    queues: &[QueueStats],
    workers: &[WorkerInfo],
    at: DateTime<Utc>,
    open: &mut BTreeMap<Key, String>,
) {
    let since = at - chrono_span(limit);
    for q in queues.iter().filter(|q| q.ready > 0) {
        let alive = workers
            .iter()
            .any(|w| w.queue == q.queue && w.heartbeat_at >= since);
        if !alive {
            open.insert(
                (Rule::NoWorkers, q.queue.clone()),
                format!(
                    "{} has {} ready messages and no worker reported in the last {}s",
                    q.queue,
                    q.ready,
                    limit.as_secs()
                ),
            );
        }
    }
}

fn chrono_span(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds() -> Thresholds {
        Thresholds {
            failure_rate: Some(0.5),
            min_finished: 4,
            window: Duration::from_secs(300),
            oldest_ready: Some(Duration::from_secs(60)),
            dead_growth: Some(3),
            no_workers: Some(Duration::from_secs(60)),
        }
    }

    fn queue(name: &str, ready: u64, dead: u64, age: Option<u64>) -> QueueStats {
        let mut q = QueueStats::new(name);
        q.ready = ready;
        q.dead = dead;
        q.oldest_ready_age = age.map(Duration::from_secs);
        q
    }

    fn bucket(queue: &str, at: DateTime<Utc>, completed: i64, failed: i64) -> Throughput {
        Throughput::from_row(queue.into(), at.timestamp_micros(), completed, failed)
    }

    #[test]
    fn a_failure_rate_counts_only_the_window_and_needs_enough_jobs() {
        let mut rules = Rules::new(thresholds());
        let now = Utc::now();
        let old = now - chrono::TimeDelta::seconds(600);
        let reading = Reading {
            at: now,
            throughput: Some(vec![
                bucket("a", now, 1, 3),
                bucket("a", old, 100, 0),
                bucket("b", now, 1, 2),
            ]),
            ..Reading::default()
        };
        let open = rules.evaluate(&reading);
        assert!(
            open.contains_key(&(Rule::FailureRate, "a".into())),
            "{open:?}"
        );
        // b failed 2 of 3: over the rate, under the minimum of finished jobs.
        assert!(
            !open.contains_key(&(Rule::FailureRate, "b".into())),
            "{open:?}"
        );
    }

    #[test]
    fn dead_letters_grow_against_the_oldest_reading_in_the_window() {
        let mut rules = Rules::new(thresholds());
        let t0 = Utc::now();
        let at = |s| t0 + chrono::TimeDelta::seconds(s);
        let read = |rules: &mut Rules, s, dead| {
            rules.evaluate(&Reading {
                at: at(s),
                queues: vec![queue("a", 0, dead, None)],
                ..Reading::default()
            })
        };
        assert!(read(&mut rules, 0, 10).is_empty());
        assert!(read(&mut rules, 60, 12).is_empty());
        assert!(
            !read(&mut rules, 120, 13).is_empty(),
            "3 more within the window"
        );
        // The first reading left the window: 12 → 13 is growth of 1.
        assert!(read(&mut rules, 330, 13).is_empty());
    }

    #[test]
    fn ready_messages_without_a_live_worker_and_old_messages_are_incidents() {
        let mut rules = Rules::new(thresholds());
        let now = Utc::now();
        let mut worker = WorkerInfo::this_process("served", 1);
        worker.heartbeat_at = now;
        let mut stale = WorkerInfo::this_process("stale", 1);
        stale.heartbeat_at = now - chrono::TimeDelta::seconds(120);
        let open = rules.evaluate(&Reading {
            at: now,
            queues: vec![
                queue("served", 5, 0, Some(10)),
                queue("stale", 5, 0, Some(90)),
                queue("idle", 0, 0, None),
            ],
            workers: Some(vec![worker, stale]),
            ..Reading::default()
        });
        let keys: Vec<_> = open.keys().cloned().collect();
        assert_eq!(
            keys,
            vec![
                (Rule::OldestReady, "stale".to_owned()),
                (Rule::NoWorkers, "stale".to_owned()),
            ]
        );
    }
}
