//! Metrics through the [`metrics`] facade: nothing is recorded until the application
//! installs a recorder (the command line installs a Prometheus one for `serve` and
//! `work --metrics-listen`).
//!
//! Every metric also carries a `tenant` label when it comes from a tenant's store or
//! worker (`QUEUE_SCHEMA`, see [`crate::tenants`]).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `switchyard_published_total` | counter | queue, kind |
//! | `switchyard_unique_conflicts_total` | counter | queue, kind, outcome (rejected, replaced) |
//! | `switchyard_reserved_total` | counter | queue, kind |
//! | `switchyard_acked_total` | counter | queue, kind |
//! | `switchyard_released_total` | counter | queue, kind |
//! | `switchyard_dead_lettered_total` | counter | queue, kind, reason |
//! | `switchyard_snoozed_total` | counter | queue, kind, reason (snoozed, rate_limited) |
//! | `switchyard_schedule_fired_total` | counter | schedule |
//! | `switchyard_schedule_missed_total` | counter | schedule |
//! | `switchyard_handler_duration_seconds` | histogram | queue, kind |
//! | `switchyard_queue_depth` | gauge | queue, state (ready, delayed, reserved, dead) |
//! | `switchyard_queue_oldest_ready_age_seconds` | gauge | queue |
//! | `switchyard_workers` | gauge | queue (workers that reported in the last 30 s; from `serve`, with a status store) |

use std::time::Duration;

use crate::registry::WorkerInfo;
use crate::transport::QueueStats;

/// Messages published (by [`crate::status::Jobs`] and the command line).
pub const PUBLISHED: &str = "switchyard_published_total";
/// Publishes that found their unique key held: rejected (or throttled), or replaced
/// (debounced).
pub const UNIQUE_CONFLICTS: &str = "switchyard_unique_conflicts_total";
/// Messages a worker reserved.
pub const RESERVED: &str = "switchyard_reserved_total";
/// Messages acknowledged after their handler succeeded.
pub const ACKED: &str = "switchyard_acked_total";
/// Failed deliveries released for a retry.
pub const RELEASED: &str = "switchyard_released_total";
/// Messages moved to the dead-letter store.
pub const DEAD_LETTERED: &str = "switchyard_dead_lettered_total";
/// Jobs that came back to wait without counting an attempt.
pub const SNOOZED: &str = "switchyard_snoozed_total";
/// Jobs an operator cancelled, as a worker ended them.
pub const CANCELLED: &str = "switchyard_cancelled_total";
/// Jobs a worker's limit held back before they ran.
pub const LIMITED: &str = "switchyard_limited_total";
/// Schedule slots fired (each counted once, by the worker that moved the cursor).
pub const SCHEDULE_FIRED: &str = "switchyard_schedule_fired_total";
/// Schedule slots that passed unfired under the schedule's catch-up policy.
pub const SCHEDULE_MISSED: &str = "switchyard_schedule_missed_total";
/// How long handlers ran.
pub const HANDLER_DURATION: &str = "switchyard_handler_duration_seconds";
/// Messages per queue and state.
pub const QUEUE_DEPTH: &str = "switchyard_queue_depth";
/// Age of each queue's oldest ready message.
pub const OLDEST_READY_AGE: &str = "switchyard_queue_oldest_ready_age_seconds";

/// Workers per queue that reported recently.
pub const WORKERS: &str = "switchyard_workers";

/// Describes every metric to the installed recorder (units and help texts).
pub fn describe() {
    metrics::describe_counter!(PUBLISHED, "Messages published.");
    metrics::describe_counter!(
        UNIQUE_CONFLICTS,
        "Publishes that found their unique key held, by outcome (rejected, replaced)."
    );
    metrics::describe_counter!(RESERVED, "Messages reserved by workers.");
    metrics::describe_counter!(
        ACKED,
        "Messages acknowledged after their handler succeeded."
    );
    metrics::describe_counter!(RELEASED, "Failed deliveries released for a retry.");
    metrics::describe_counter!(DEAD_LETTERED, "Messages moved to the dead-letter store.");
    metrics::describe_counter!(
        SNOOZED,
        "Jobs that came back to wait without counting an attempt, by reason (snoozed, rate_limited)."
    );
    metrics::describe_counter!(
        CANCELLED,
        "Jobs an operator cancelled, as a worker ended them, by whether their handler had started (ran: true, false)."
    );
    metrics::describe_counter!(
        LIMITED,
        "Jobs a limit held back before they ran (saturation), by limit (concurrency, rate, store_failed)."
    );
    metrics::describe_counter!(SCHEDULE_FIRED, "Schedule slots fired, each counted once.");
    metrics::describe_counter!(
        SCHEDULE_MISSED,
        "Schedule slots that passed unfired while no worker could fire them, under the schedule's catch-up policy."
    );
    metrics::describe_histogram!(
        HANDLER_DURATION,
        metrics::Unit::Seconds,
        "How long handlers ran."
    );
    metrics::describe_gauge!(QUEUE_DEPTH, "Messages per queue and state.");
    metrics::describe_gauge!(WORKERS, "Workers per queue that reported in the last 30 s.");
    metrics::describe_gauge!(
        OLDEST_READY_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest ready message, where the backend can tell."
    );
}

pub(crate) fn published(tenant: Option<&str>, queue: &str, kind: &str) {
    count(PUBLISHED, tenant, queue, kind, 1);
}

pub(crate) fn schedule_slots(tenant: Option<&str>, schedule: &str, fired: u64, missed: u64) {
    let labels = labels(tenant, [("schedule", schedule.to_owned())]);
    metrics::counter!(SCHEDULE_FIRED, labels.clone()).increment(fired);
    metrics::counter!(SCHEDULE_MISSED, labels).increment(missed);
}

pub(crate) fn unique_conflict(tenant: Option<&str>, queue: &str, kind: &str, replaced: bool) {
    let outcome = if replaced { "replaced" } else { "rejected" };
    let labels = labels(
        tenant,
        [
            ("queue", queue.to_owned()),
            ("kind", kind.to_owned()),
            ("outcome", outcome.to_owned()),
        ],
    );
    metrics::counter!(UNIQUE_CONFLICTS, labels).increment(1);
}

/// The labels of one metric: `tenant` first when there is one (see
/// [`crate::tenants`]), then `pairs`.
fn labels<const N: usize>(
    tenant: Option<&str>,
    pairs: [(&'static str, String); N],
) -> Vec<metrics::Label> {
    tenant
        .map(|t| metrics::Label::new("tenant", t.to_owned()))
        .into_iter()
        .chain(pairs.map(|(k, v)| metrics::Label::new(k, v)))
        .collect()
}

pub(crate) fn count(name: &'static str, tenant: Option<&str>, queue: &str, kind: &str, n: u64) {
    let labels = labels(
        tenant,
        [("queue", queue.to_owned()), ("kind", kind.to_owned())],
    );
    metrics::counter!(name, labels).increment(n);
}

pub(crate) fn dead_lettered(tenant: Option<&str>, queue: &str, kind: &str, reason: &str) {
    let labels = labels(
        tenant,
        [
            ("queue", queue.to_owned()),
            ("kind", kind.to_owned()),
            ("reason", reason.to_owned()),
        ],
    );
    metrics::counter!(DEAD_LETTERED, labels).increment(1);
}

pub(crate) fn snoozed(tenant: Option<&str>, queue: &str, kind: &str, rate_limited: bool) {
    let reason = if rate_limited {
        "rate_limited"
    } else {
        "snoozed"
    };
    let labels = labels(
        tenant,
        [
            ("queue", queue.to_owned()),
            ("kind", kind.to_owned()),
            ("reason", reason.to_owned()),
        ],
    );
    metrics::counter!(SNOOZED, labels).increment(1);
}

pub(crate) fn cancelled(tenant: Option<&str>, queue: &str, kind: &str, ran: bool) {
    let labels = labels(
        tenant,
        [
            ("queue", queue.to_owned()),
            ("kind", kind.to_owned()),
            ("ran", ran.to_string()),
        ],
    );
    metrics::counter!(CANCELLED, labels).increment(1);
}

pub(crate) fn limited(tenant: Option<&str>, queue: &str, kind: &str, by: &str) {
    let labels = labels(
        tenant,
        [
            ("queue", queue.to_owned()),
            ("kind", kind.to_owned()),
            ("limit", by.to_owned()),
        ],
    );
    metrics::counter!(LIMITED, labels).increment(1);
}

pub(crate) fn handler_duration(tenant: Option<&str>, queue: &str, kind: &str, d: Duration) {
    let labels = labels(
        tenant,
        [("queue", queue.to_owned()), ("kind", kind.to_owned())],
    );
    metrics::histogram!(HANDLER_DURATION, labels).record(d.as_secs_f64());
}

/// Sets the depth and age gauges from `stats` of `tenant`'s store (`None`: no tenant).
pub fn record_stats(tenant: Option<&str>, stats: &[QueueStats]) {
    for s in stats {
        for (state, n) in [
            ("ready", s.ready),
            ("delayed", s.delayed),
            ("reserved", s.reserved),
            ("dead", s.dead),
        ] {
            let labels = labels(
                tenant,
                [("queue", s.queue.clone()), ("state", state.to_owned())],
            );
            metrics::gauge!(QUEUE_DEPTH, labels).set(n as f64);
        }
        if let Some(age) = s.oldest_ready_age {
            let labels = labels(tenant, [("queue", s.queue.clone())]);
            metrics::gauge!(OLDEST_READY_AGE, labels).set(age.as_secs_f64());
        }
    }
}

/// Sets the workers gauge: per queue, the workers the status store heard from within
/// [`GONE_AFTER`](crate::status::GONE_AFTER) (what its `workers()` returns). Every queue
/// of `queues` gets a value, 0 when no worker serves it, so that a gauge never keeps the
/// count of workers that are gone.
pub fn record_workers(tenant: Option<&str>, queues: &[QueueStats], workers: &[WorkerInfo]) {
    let mut per_queue: std::collections::BTreeMap<&str, u32> =
        queues.iter().map(|q| (q.queue.as_str(), 0)).collect();
    for w in workers {
        *per_queue.entry(w.queue.as_str()).or_default() += 1;
    }
    for (queue, n) in per_queue {
        let labels = labels(tenant, [("queue", queue.to_owned())]);
        metrics::gauge!(WORKERS, labels).set(f64::from(n));
    }
}
