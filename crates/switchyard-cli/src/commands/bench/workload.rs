//! The jobs a run publishes (no-op jobs on fresh queues), and how pickup is sampled.

use std::time::Duration;

use switchyard::{Envelope, QueueName, Result};
use uuid::Uuid;

/// Pickup latency: messages published at a fixed rate to an idle consumer.
pub(super) const PICKUP_MESSAGES: usize = 200;
pub(super) const PICKUP_INTERVAL: Duration = Duration::from_millis(10);

/// The p50 and p99 of `latencies`, in ms.
pub(super) fn percentiles(mut latencies: Vec<Duration>) -> (f64, f64) {
    latencies.sort();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    (pct(0.50), pct(0.99))
}

/// Messages published one by one: a tenth of the batch, 100 to 2,000.
pub(super) fn single_count(messages: usize) -> usize {
    (messages / 10).clamp(100, 2_000)
}

/// A fresh queue name for one measurement.
pub(super) fn queue(label: &str) -> Result<QueueName> {
    Ok(QueueName::new(format!(
        "bench.{label}.{}",
        Uuid::new_v4().simple()
    ))?)
}

/// `n` no-op jobs on `queue`.
pub(super) fn jobs(queue: &QueueName, n: usize) -> Result<Vec<Envelope>> {
    (0..n)
        .map(|i| {
            Envelope::builder(queue.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .build()
        })
        .collect()
}

/// Keys of the ordered drain.
pub(super) const ORDERING_KEYS: usize = 1_000;

/// `n` no-op jobs on `queue` over [`ORDERING_KEYS`] ordering keys, each key's in order.
pub(super) fn keyed_jobs(queue: &QueueName, n: usize) -> Result<Vec<Envelope>> {
    (0..n)
        .map(|i| {
            Envelope::builder(queue.as_str(), "noop")
                .payload(&serde_json::json!({ "n": i }))
                .ordering_key(format!("key-{}", i % ORDERING_KEYS))
                .build()
        })
        .collect()
}

/// `n` per `elapsed`, or 0 when there was nothing to time (`--messages 0`).
pub(super) fn rate(n: usize, elapsed: Duration) -> f64 {
    match n {
        0 => 0.0,
        n => n as f64 / elapsed.as_secs_f64(),
    }
}
