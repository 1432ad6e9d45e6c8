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
