//! Running workers, as they report themselves to the status store: what the
//! dashboard's list of workers shows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// How often a worker says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// A worker not heard from for this long is gone (killed, or its machine lost); the
/// store forgets it. A worker that stops cleanly removes itself at once.
pub const GONE_AFTER: Duration = Duration::from_secs(30);

/// One running worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Unique per run of a worker.
    pub id: Uuid,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The queue it works.
    pub queue: String,
    /// Handlers it runs at once.
    pub concurrency: u32,
    /// When it started (store clock).
    pub started_at: DateTime<Utc>,
    /// When it last reported (store clock).
    pub heartbeat_at: DateTime<Utc>,
    /// Jobs it has finished (succeeded, retried or dead-lettered).
    pub jobs_done: u64,
}

impl WorkerInfo {
    /// This process working `queue`; the times are set by the store.
    pub fn this_process(queue: &str, concurrency: usize) -> Self {
        let now = Utc::now();
        WorkerInfo {
            id: Uuid::now_v7(),
            host: host_name(),
            pid: std::process::id(),
            queue: queue.to_owned(),
            concurrency: u32::try_from(concurrency).unwrap_or(u32::MAX),
            started_at: now,
            heartbeat_at: now,
            jobs_done: 0,
        }
    }

    /// A worker read back from a store: times in microseconds since the epoch; `None`
    /// when a value is out of range (the row is skipped, not the whole list).
    #[allow(clippy::too_many_arguments)]
    pub fn from_row(
        id: &str,
        host: String,
        pid: i64,
        queue: String,
        concurrency: i64,
        started_at: i64,
        heartbeat_at: i64,
        jobs_done: i64,
    ) -> Option<Self> {
        Some(WorkerInfo {
            id: Uuid::parse_str(id).ok()?,
            host,
            pid: u32::try_from(pid).ok()?,
            queue,
            concurrency: u32::try_from(concurrency).ok()?,
            started_at: DateTime::from_timestamp_micros(started_at)?,
            heartbeat_at: DateTime::from_timestamp_micros(heartbeat_at)?,
            jobs_done: u64::try_from(jobs_done).unwrap_or(0),
        })
    }
}

/// How job records name the worker that ran an attempt: `host:pid`.
pub fn worker_label() -> String {
    format!("{}:{}", host_name(), std::process::id())
}

/// What claims record as their holder by default: `host:pid`, computed once.
pub(crate) fn process_holder() -> &'static str {
    static HOLDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOLDER.get_or_init(worker_label)
}

/// The machine's name: the kernel's, else `$HOSTNAME`, else `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}
