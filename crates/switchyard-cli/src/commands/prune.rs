//! `switchyard prune --older-than DUR`: deletes job results and dead letters that ended
//! longer ago than DUR. `work --prune-older-than DUR` runs the same every hour.

use std::sync::Arc;
use std::time::Duration;

use switchyard::{parse_duration, Config, DeadSelection, Result, StatusStore, Transport};

use crate::cli::PruneArgs;

/// How often a worker prunes.
const EVERY: Duration = Duration::from_secs(3600);

pub(crate) async fn run(config: &Config, args: PruneArgs, json: bool) -> Result<()> {
    let older_than = parse_duration("--older-than", &args.older_than)?;
    // Only a status store that already exists: the transport's own, or on RabbitMQ the
    // SQL store of DATABASE_URL when it can be opened without creating anything (a
    // store that does not exist has nothing to prune).
    let jobs = switchyard::connect_existing_jobs(config).await?;
    let (transport, store) = (jobs.transport().clone(), jobs.store().cloned());
    let (results, dead) = prune(&transport, store.as_ref(), older_than).await?;
    if json {
        crate::output::json_line(&serde_json::json!({
            "results": results, "dead_letters": dead,
            "older_than_seconds": older_than.as_secs(),
        }))
    } else {
        outln!(
            "pruned {results} job result{} and {dead} dead letter{} older than {}",
            if results == 1 { "" } else { "s" },
            if dead == 1 { "" } else { "s" },
            args.older_than
        );
        Ok(())
    }
}

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
    stop: switchyard::CancellationToken,
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
