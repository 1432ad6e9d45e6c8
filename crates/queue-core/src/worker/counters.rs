//! A worker's live counts and their snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Above this average run time handlers count as slow and nothing is prefetched.
const FAST_HANDLER: Duration = Duration::from_millis(10);

/// Live counts of a worker, readable while it runs (for progress bars and metrics).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct WorkerCounters {
    /// Messages handled and acknowledged.
    pub succeeded: AtomicU64,
    /// Failed deliveries released for a retry.
    pub retried: AtomicU64,
    /// Messages moved to the dead-letter store.
    pub dead_lettered: AtomicU64,
    /// Deliveries whose lease was lost (another worker has the message).
    pub lost: AtomicU64,
    /// Unfinished messages released at shutdown.
    pub released_on_shutdown: AtomicU64,
    /// Handlers running now.
    pub in_flight: AtomicU64,
    /// Moving average of handler run time, in microseconds.
    handler_micros: AtomicU64,
}

impl WorkerCounters {
    pub(super) fn record_duration(&self, d: Duration) {
        let sample = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let old = self.handler_micros.load(Ordering::Relaxed);
        // An exponential moving average over about eight jobs.
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.handler_micros.store(new, Ordering::Relaxed);
    }

    /// Until the first job has finished, handlers count as slow: nothing is prefetched
    /// for jobs that may take minutes.
    pub(super) fn handlers_are_fast(&self) -> bool {
        let avg = self.handler_micros.load(Ordering::Relaxed);
        avg > 0 && u128::from(avg) < FAST_HANDLER.as_micros()
    }
}

/// A snapshot of [`WorkerCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Messages handled and acknowledged.
    pub succeeded: u64,
    /// Failed deliveries released for a retry.
    pub retried: u64,
    /// Messages moved to the dead-letter store.
    pub dead_lettered: u64,
    /// Deliveries whose lease was lost.
    pub lost: u64,
    /// Unfinished messages released at shutdown.
    pub released_on_shutdown: u64,
}

impl WorkerCounters {
    /// The counts now.
    pub fn snapshot(&self) -> WorkerReport {
        WorkerReport {
            succeeded: self.succeeded.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            released_on_shutdown: self.released_on_shutdown.load(Ordering::Relaxed),
        }
    }
}
