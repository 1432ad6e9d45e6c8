//! The transport's upkeep, called in the background while a worker runs, so that none
//! of its claims waits for it (a key repair over a large table took 267 ms inline).

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

/// Waits for the upkeep task, told to stop, to finish what it is doing, within
/// [`UPKEEP_GRACE`].
pub(super) async fn finish(mut upkeep: JoinHandle<()>) {
    match tokio::time::timeout(UPKEEP_GRACE, &mut upkeep).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => tracing::error!("the worker's upkeep task panicked"),
        Err(_) => {
            upkeep.abort();
            tracing::warn!("the transport's upkeep did not finish within {UPKEEP_GRACE:?} of the worker's stop; dropped");
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
                // An upkeep under way is let finish (see `finish`): it may be inside a
                // transaction that moves rows to the dead-letter store.
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
