//! `work --prune-older-than`: a pass as the worker starts, so that it starts on a pruned
//! store, then every hour. Where the store keeps schedules the hourly passes are the
//! schedule `switchyard.prune`, fired by one worker of the store per slot; elsewhere
//! (RabbitMQ without a control store, job status off) each worker prunes every hour
//! itself.

use std::sync::Arc;
use std::time::Duration;

use switchyard::{CancellationToken, StatusStore, Transport};

/// How often a worker without schedules prunes.
const EVERY: Duration = Duration::from_secs(3600);

/// One pass; a failure is only logged.
pub(crate) async fn prune_once(
    transport: &Arc<dyn Transport>,
    store: Option<&Arc<dyn StatusStore>>,
    older_than: Duration,
) {
    match switchyard::schedule::prune(transport, store, older_than).await {
        Ok((results, dead)) => tracing::info!(results, dead_letters = dead, "pruned"),
        Err(err) => tracing::warn!(error = %err, "pruning failed; trying again at the next pass"),
    }
}

/// Prunes now, then every hour until the worker stops. The first pass is awaited.
pub(crate) async fn start_periodic(
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn StatusStore>>,
    older_than: Duration,
    stop: CancellationToken,
) {
    prune_once(&transport, store.as_ref(), older_than).await;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            prune_once(&transport, store.as_ref(), older_than).await;
        }
    });
}
