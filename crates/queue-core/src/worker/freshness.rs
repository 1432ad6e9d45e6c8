//! Whether a run still surely holds its lease and limit slots, read by its handler.
//!
//! The worker renews both on a beat; a process that was stopped (SIGSTOP, a frozen VM,
//! swap) wakes with a beat overdue and learns of the loss only at its next renewal's
//! answer. A handler about to start a side effect reads this instead: the monotonic
//! clock keeps counting while the process is stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run's last renewals, shared by the worker's watch loop and the handler's context.
#[derive(Debug, Clone)]
pub(crate) struct Freshness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: Instant,
    lease_renewed: AtomicU64,
    lease: Duration,
    slots_renewed: AtomicU64,
    /// None when the run holds no limit slot.
    slots: Option<Duration>,
}

impl Freshness {
    /// A run whose lease (`lease` long) was renewed no earlier than `lease_since` and
    /// whose slots (`slots`: since when, held how long) no earlier than their own time.
    pub(crate) fn new(
        lease_since: Instant,
        lease: Duration,
        slots: Option<(Instant, Duration)>,
    ) -> Self {
        let base = slots.map_or(lease_since, |(since, _)| since.min(lease_since));
        let nanos = |at: Instant| {
            u64::try_from(at.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
        };
        Freshness {
            inner: Arc::new(Inner {
                base,
                lease_renewed: AtomicU64::new(nanos(lease_since)),
                lease,
                slots_renewed: AtomicU64::new(slots.map_or(0, |(since, _)| nanos(since))),
                slots: slots.map(|(_, hold)| hold),
            }),
        }
    }

    fn since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.inner.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The lease was renewed by a call made at `asked`.
    pub(crate) fn lease_renewed(&self, asked: Instant) {
        self.inner
            .lease_renewed
            .fetch_max(self.since_base(asked), Ordering::Relaxed);
    }

    /// The slots were renewed by a call made at `asked`.
    pub(crate) fn slots_renewed(&self, asked: Instant) {
        self.inner
            .slots_renewed
            .fetch_max(self.since_base(asked), Ordering::Relaxed);
    }

    /// Whether lease and slots were renewed within half their length: a run that finds
    /// it false may have been overtaken by another worker's run of the same job, or
    /// by a job that took its slots.
    pub(crate) fn is_current(&self) -> bool {
        let now = self.since_base(Instant::now());
        let fresh = |renewed: &AtomicU64, hold: Duration| {
            let age = now.saturating_sub(renewed.load(Ordering::Relaxed));
            Duration::from_nanos(age) < hold / 2
        };
        fresh(&self.inner.lease_renewed, self.inner.lease)
            && self
                .inner
                .slots
                .is_none_or(|hold| fresh(&self.inner.slots_renewed, hold))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_current_for_half_its_hold_after_each_renewal() {
        let start = Instant::now() - Duration::from_secs(10);
        let f = Freshness::new(
            start,
            Duration::from_secs(30),
            Some((start, Duration::from_secs(4))),
        );
        assert!(!f.is_current(), "the slots were renewed 10 s ago, held 4 s");
        f.slots_renewed(Instant::now());
        assert!(f.is_current());
        f.lease_renewed(start);
        assert!(
            f.is_current(),
            "an older renewal does not move the clock back"
        );
        let g = Freshness::new(
            Instant::now() - Duration::from_secs(16),
            Duration::from_secs(30),
            None,
        );
        assert!(!g.is_current(), "a lease of 30 s renewed 16 s ago");
    }
}
