//! `switchyard migrate`: creates or updates the selected backend's tables (both
//! backends while a migration between them is under way); on RabbitMQ, declares the
//! delay chain.

use switchyard::{BackendKind, Config, Result};

use super::common::{store_url, store_url_of};

pub(crate) async fn run(config: &Config, json: bool) -> Result<()> {
    if config.migrating() {
        // Both backends of the migration.
        let mut ready = Vec::new();
        for kind in [config.backend, config.backend.other()] {
            let t = switchyard::connect_backend(config, kind, true).await?;
            ready.push(serde_json::json!({
                "backend": kind.to_string(),
                "transport": t.name(),
                "url": store_url_of(config, kind),
            }));
            if !json {
                outln!(
                    "{kind} ({}) is ready: {}",
                    t.name(),
                    store_url_of(config, kind)
                );
            }
        }
        if json {
            crate::output::json_line(&serde_json::json!({
                "migrated": true,
                "backend": "router",
                "backends": ready,
            }))?;
        }
        return Ok(());
    }
    let t = switchyard::connect(config).await?;
    let rabbitmq = config.backend == BackendKind::RabbitMq;
    if json {
        crate::output::json_line(&serde_json::json!({
            "migrated": true,
            "backend": t.name(),
            "url": store_url(config),
            "table": (!rabbitmq).then(|| config.table.as_str()),
        }))?;
    } else if rabbitmq {
        // Queues are declared when first used; connecting declared the delay chain.
        outln!(
            "{} is ready: {} (delay chain declared)",
            t.name(),
            store_url(config)
        );
    } else {
        outln!(
            "{} is ready: {} (table {})",
            t.name(),
            store_url(config),
            config.table
        );
    }
    Ok(())
}
