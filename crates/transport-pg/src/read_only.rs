//! When this process last saw SQLSTATE 25006 ("read-only transaction"): the clock that
//! tells the pool which connections were opened before a failover (see `standby`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// SQLSTATE of a write on a read-only server.
pub(crate) const READ_ONLY: &str = "25006";

/// When this process last saw 25006, in milliseconds since [`epoch`] (0: never). One
/// clock for every pool of the process: a pool on a healthy server only reconnects
/// once for nothing.
static READ_ONLY_SEEN: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Records that a statement failed with 25006.
pub(crate) fn saw_read_only() {
    READ_ONLY_SEEN.store(now_ms(), Ordering::Relaxed);
}

/// Whether a pooled connection of this age was opened before the last 25006: it may
/// point at the demoted server, so the pool drops it (`before_acquire`).
pub(crate) fn opened_before_read_only(age: Duration) -> bool {
    let seen = READ_ONLY_SEEN.load(Ordering::Relaxed);
    if seen == 0 {
        return false;
    }
    let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    now_ms().saturating_sub(age_ms) <= seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_older_than_the_last_read_only_error_are_dropped() {
        std::thread::sleep(Duration::from_millis(5));
        saw_read_only();
        // Opened long ago: before the error.
        assert!(opened_before_read_only(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(5));
        // Opened just now: after it.
        assert!(!opened_before_read_only(Duration::ZERO));
    }
}
