//! The loop of a publish watch (MySQL's and SQLite's): one task per transport that looks
//! every few milliseconds for other processes' publishes and wakes the idle workers of
//! the queues that got rows. What a look reads is the backend's ([`Look`]); the pacing,
//! the timeout, the backoff after a failure and what is logged of failures are here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::wakers::Wakers;

/// The longest a connect or a read of the watch may take before it is given up.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Backoff after a failure: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Failures in a row after which the watch says so once (before, only at debug).
const WARN_AFTER: u32 = 5;

/// One backend's look at its database.
#[async_trait]
pub trait Look: Send {
    /// Whether this look asks the database: cheap checks only. By default, whenever a
    /// worker may be waiting (a claim of the transport last found nothing).
    fn due(&mut self, wakers: &Wakers) -> bool {
        wakers.any_idle()
    }

    /// Asks the database for rows newer than the last seen, and wakes their queues.
    async fn ask(&mut self, wakers: &Wakers) -> Result<(), Box<dyn fmt::Display + Send>>;

    /// Drops the connection after a failure: the next look connects again.
    async fn disconnect(&mut self);
}

/// Runs `look` every `every` until `stop`, then disconnects it.
pub async fn run_watch(
    mut look: impl Look,
    every: Duration,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(1));
    let mut pause = every;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        if !look.due(&wakers) {
            continue;
        }
        let step = tokio::select! {
            _ = stop.cancelled() => break,
            step = tokio::time::timeout(STATEMENT_TIMEOUT, look.ask(&wakers)) => step,
        };
        let failed = match step {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(err.to_string()),
            Err(_) => Some(format!("no answer within {STATEMENT_TIMEOUT:?}")),
        };
        pause = match failed {
            None => {
                failures = 0;
                every
            }
            Some(why) => {
                failures += 1;
                // Said once when it keeps failing: the workers' polling covers meanwhile.
                if failures == WARN_AFTER {
                    tracing::warn!(error = %why, "the publish watch keeps failing; idle workers find other processes' publishes by polling");
                } else {
                    tracing::debug!(error = %why, "publish watch failed; the workers poll meanwhile");
                }
                look.disconnect().await;
                (pause * 2).clamp(BACKOFF.0, BACKOFF.1)
            }
        };
    }
    look.disconnect().await;
}
