//! Pruning of finished job records and dead letters: `switchyard prune` once, and
//! `work --prune-older-than` every hour.

use std::sync::Arc;
use std::time::Duration;

use switchyard::{CancellationToken, DeadSelection, Result, StatusStore, Transport};

/// How often a worker prunes.
const EVERY: Duration = Duration::from_secs(3600);

/// Deletes finished job records and dead letters older than `older_than`.
pub(crate) async fn prune(
    transport: &Arc<dyn Transport>,
    store: Option<&Arc<dyn StatusStore>>,
    older_than: Duration,
) -> Result<(u64, u64)> {
    let results = match store {
        Some(store) => store.prune(older_than).await?,
        None => 0,
    };
    let dead = transport
        .dead_purge(None, &DeadSelection::OlderThan(older_than))
        .await?;
    Ok((results, dead))
}

/// Prunes now, then every hour until the worker stops. The first pass is awaited, so a
/// worker starts on a pruned store (and a failure to prune is only logged).
pub(crate) async fn start_periodic(
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn StatusStore>>,
    older_than: Duration,
    stop: CancellationToken,
) {
    let pass = move |transport: Arc<dyn Transport>, store: Option<Arc<dyn StatusStore>>| async move {
        match prune(&transport, store.as_ref(), older_than).await {
            Ok((results, dead)) => tracing::info!(results, dead_letters = dead, "pruned"),
            Err(err) => tracing::warn!(error = %err, "pruning failed; trying again in an hour"),
        }
    };
    pass(transport.clone(), store.clone()).await;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            pass(transport.clone(), store.clone()).await;
        }
    });
}
