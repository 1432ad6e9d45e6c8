//! How much work optimistic claims lost to competitors: kept by the engine for every SQL
//! backend, read by the transport's `claim_counters` (the bench reports the ratio), and
//! the contention the claims meet (which slice of the candidates they take).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a loss a transport's claims still spread out.
const LOSS_MEMORY: Duration = Duration::from_secs(1);

/// How much work optimistic claims lost to competitors, since the transport was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimCounters {
    /// Rows that optimistic claims tried to take (candidates that were ready when read,
    /// up to the batch size).
    pub requested: u64,
    /// Of those, rows a competitor took between the read and the compare-and-set.
    pub wasted: u64,
    /// Optimistic compare-and-sets that lost a deadlock or a lock wait and ran again.
    pub conflicts: u64,
}

impl ClaimCounters {
    /// `wasted / requested`, or 0 before any claim.
    pub fn wasted_ratio(&self) -> f64 {
        if self.requested == 0 {
            0.0
        } else {
            self.wasted as f64 / self.requested as f64
        }
    }

    /// What was counted between `earlier` and this reading.
    pub fn since(&self, earlier: &ClaimCounters) -> ClaimCounters {
        ClaimCounters {
            requested: self.requested.saturating_sub(earlier.requested),
            wasted: self.wasted.saturating_sub(earlier.wasted),
            conflicts: self.conflicts.saturating_sub(earlier.conflicts),
        }
    }
}

/// The engine's running counts behind [`ClaimCounters`], and the contention it saw
/// lately.
#[derive(Debug, Default)]
pub struct ClaimTally {
    requested: AtomicU64,
    wasted: AtomicU64,
    conflicts: AtomicU64,
    /// Optimistic claims of this transport in flight.
    in_flight: AtomicUsize,
    /// When a compare-and-set last lost rows to a competitor.
    last_loss: Mutex<Option<Instant>>,
}

/// An optimistic claim in flight, counted until dropped.
pub(super) struct InFlight<'a> {
    tally: &'a ClaimTally,
    /// How many claims of this transport were in flight when it started: it takes the
    /// slice of the candidates after theirs.
    pub(super) rank: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.tally.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClaimTally {
    /// Counts an optimistic claim in flight until the guard is dropped.
    pub(super) fn enter(&self) -> InFlight<'_> {
        let rank = self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { tally: self, rank }
    }

    /// Whether a compare-and-set lost rows to a competitor lately: claims of other
    /// processes race this transport's for the same candidates.
    pub(super) fn lost_lately(&self) -> bool {
        self.last_loss
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < LOSS_MEMORY)
    }

    /// A compare-and-set that tried to take `tried` rows and got `got`.
    pub(super) fn round(&self, tried: usize, got: usize) {
        self.requested.fetch_add(tried as u64, Ordering::Relaxed);
        let lost = tried.saturating_sub(got);
        self.wasted.fetch_add(lost as u64, Ordering::Relaxed);
        if lost > 0 {
            *self.last_loss.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
    }

    /// An optimistic compare-and-set that lost a conflict and runs again.
    pub fn conflict(&self) {
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn read(&self) -> ClaimCounters {
        ClaimCounters {
            requested: self.requested.load(Ordering::Relaxed),
            wasted: self.wasted.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
        }
    }
}
