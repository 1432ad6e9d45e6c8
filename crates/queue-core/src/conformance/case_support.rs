//! Helpers of the transport cases: fresh queues, messages, stores, waiting reserves.
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::harness::{Harness, OpenOptions, Store};
use crate::{Envelope, QueueName, QueueStats, Reservation, Result, Transport, TransportExt};

/// Whether a case applies to `t`, which lacks the capability `name` when `has` is false:
/// then it says so and the case ends there. Capabilities are the one place that says
/// what a backend cannot do, so no backend keeps a list of cases it skips.
pub(super) fn applies(t: &dyn Transport, name: &str, has: bool) -> bool {
    if !has {
        eprintln!(
            "not applicable to {}: it lacks the capability `{name}`",
            t.name()
        );
    }
    has
}

pub(super) fn fresh_queue() -> QueueName {
    QueueName::new(format!("q-{}", Uuid::new_v4().simple())).expect("a valid queue name")
}

pub(super) fn message(queue: &QueueName, kind: &str) -> Envelope {
    Envelope::builder(queue.as_str(), kind)
        .payload(&serde_json::json!({ "kind": kind }))
        .build()
        .expect("a valid envelope")
}

pub(super) fn with_lease(visibility_timeout: Duration) -> OpenOptions {
    OpenOptions {
        visibility_timeout,
        ..OpenOptions::default()
    }
}

pub(super) async fn open(
    harness: &Arc<dyn Harness>,
) -> Result<(Box<dyn Store>, Arc<dyn Transport>)> {
    let store = harness.store().await?;
    let transport = store.open(OpenOptions::default()).await?;
    Ok((store, transport))
}

pub(super) async fn stats_of(t: &dyn Transport, queue: &QueueName) -> Result<QueueStats> {
    let all = t.stats(Some(queue)).await?;
    Ok(all
        .into_iter()
        .find(|s| s.queue == queue.as_str())
        .unwrap_or_else(|| QueueStats::new(queue.as_str())))
}

/// Reserves until a message arrives or `within` passes.
pub(super) async fn reserve_within(
    t: &dyn Transport,
    queue: &QueueName,
    within: Duration,
) -> Result<Option<Reservation>> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(r) = t.reserve(queue).await? {
            return Ok(Some(r));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn kinds(rs: &[Reservation]) -> Vec<String> {
    rs.iter().map(|r| r.envelope.kind.clone()).collect()
}
