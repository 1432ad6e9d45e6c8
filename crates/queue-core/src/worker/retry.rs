use std::time::Duration;

use crate::envelope::Envelope;

/// When to retry a failed job: exponential backoff with a cap and full jitter, and how
/// many attempts a message gets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The backoff ceiling of the first retry; doubles with each attempt.
    pub base: Duration,
    /// The largest backoff ceiling.
    pub cap: Duration,
    /// Deliveries a message gets before it is dead-lettered, unless the message carries
    /// its own `max_attempts`.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(5),
            cap: Duration::from_secs(300),
            max_attempts: 3,
        }
    }
}

impl RetryPolicy {
    /// A policy with `base`, `cap` and `max_attempts`.
    pub fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        RetryPolicy {
            base,
            cap: cap.max(base),
            max_attempts: max_attempts.max(1),
        }
    }

    /// The backoff ceiling after `failures` failed deliveries (1 for the first):
    /// `min(cap, base · 2^(failures-1))`.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << exp)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// A backoff drawn uniformly from `[0, ceiling(failures)]` ("full jitter"), so that
    /// jobs failing together do not retry together.
    pub fn backoff(&self, failures: u32) -> Duration {
        let ceiling = self.ceiling(failures);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }

    /// The attempt limit of `envelope`: its own, else the policy's.
    pub fn max_attempts_for(&self, envelope: &Envelope) -> u32 {
        envelope.max_attempts.unwrap_or(self.max_attempts).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let p = RetryPolicy::default();
        let secs: Vec<u64> = (1..=8).map(|n| p.ceiling(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn backoff_has_full_jitter_within_the_ceiling() {
        let p = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(2), 5);
        for failures in 1..=10 {
            let ceiling = p.ceiling(failures);
            let draws: Vec<Duration> = (0..2_000).map(|_| p.backoff(failures)).collect();
            assert!(draws.iter().all(|d| *d <= ceiling), "over the ceiling");
            // Full jitter spreads over the whole range, not just near the ceiling.
            let low = draws.iter().filter(|d| **d < ceiling / 4).count();
            let high = draws.iter().filter(|d| **d > ceiling * 3 / 4).count();
            assert!(
                low > 300 && high > 300,
                "not uniform: {low} low, {high} high of 2000"
            );
        }
    }

    #[test]
    fn a_message_can_override_the_attempt_limit() {
        let p = RetryPolicy::default();
        let plain = Envelope::builder("q", "k").build().expect("valid");
        let own = Envelope::builder("q", "k")
            .max_attempts(7)
            .build()
            .expect("valid");
        assert_eq!(p.max_attempts_for(&plain), 3);
        assert_eq!(p.max_attempts_for(&own), 7);
    }
}
