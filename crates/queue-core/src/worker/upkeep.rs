//! The transport's upkeep, called in the background while a worker runs, so that it is
//! not done inside the worker's claims (a key repair over a large table took 267 ms
//! inline).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::builder::Worker;

/// How often the worker calls for the upkeep; the transport paces what it does.
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a stopping worker waits for an upkeep under way before dropping it: an
/// unreachable store must not hold the stop up for its connect timeout.
const UPKEEP_GRACE: Duration = Duration::from_secs(5);

/// Waits, within [`UPKEEP_GRACE`], for the upkeep task (told to stop as the worker began
/// to wind down) to finish what it is doing. Dropping it mid-call could hand a pooled
/// connection back inside the transaction it was opening (sqlx's MySQL `begin`).
pub(super) async fn finish(mut upkeep: JoinHandle<()>) {
    match tokio::time::timeout(UPKEEP_GRACE, &mut upkeep).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => tracing::error!("the worker's upkeep task panicked"),
        Err(_) => {
            upkeep.abort();
            tracing::warn!(
                "the transport's upkeep did not finish within {UPKEEP_GRACE:?} of the worker's stop; dropped"
            );
        }
    }
}

impl Worker {
    /// Calls [`Transport::maintain`](crate::Transport::maintain) now and every
    /// [`UPKEEP_EVERY`] until `stop`; `None` where the transport keeps no upkeep.
    pub(super) fn spawn_upkeep(&self, stop: CancellationToken) -> Option<JoinHandle<()>> {
        if !self.transport.capabilities().upkeep {
            return None;
        }
        let transport = Arc::clone(&self.transport);
        Some(tokio::spawn(async move {
            loop {
                if let Err(err) = transport.maintain().await {
                    tracing::warn!(error = %err, "the transport's upkeep failed (expired messages, ordering keys); trying again later");
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(UPKEEP_EVERY) => {}
                }
            }
        }))
    }
}
