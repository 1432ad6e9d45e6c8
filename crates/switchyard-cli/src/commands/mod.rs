//! One module per command.

mod bench;
mod dead;
mod demo;
mod job;
mod move_cmd;
mod prune;
mod publish;
mod relay;
mod serve;
mod stats;
mod work;

use switchyard::{BackendKind, Config, QueueName, Result};

use crate::cli::{Cli, Command, Global};

pub(crate) async fn run(cli: Cli) -> Result<()> {
    let config = config(&cli.global)?;
    let json = cli.global.json;
    match cli.command {
        Command::Migrate if config.migrating() => {
            // Both backends of the migration.
            let mut ready = Vec::new();
            for kind in [config.backend, config.backend.other()] {
                let t = switchyard::connect_backend(&config, kind, true).await?;
                ready.push(serde_json::json!({
                    "backend": kind.to_string(),
                    "transport": t.name(),
                    "url": store_url_of(&config, kind),
                }));
                if !json {
                    outln!(
                        "{kind} ({}) is ready: {}",
                        t.name(),
                        store_url_of(&config, kind)
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
            Ok(())
        }
        Command::Migrate => {
            let t = switchyard::connect(&config).await?;
            let rabbitmq = config.backend == BackendKind::RabbitMq;
            if json {
                crate::output::json_line(&serde_json::json!({
                    "migrated": true,
                    "backend": t.name(),
                    "url": store_url(&config),
                    "table": (!rabbitmq).then(|| config.table.as_str()),
                }))?;
            } else if rabbitmq {
                // Queues are declared when first used; connecting declared the delay chain.
                outln!(
                    "{} is ready: {} (delay chain declared)",
                    t.name(),
                    store_url(&config)
                );
            } else {
                outln!(
                    "{} is ready: {} (table {})",
                    t.name(),
                    store_url(&config),
                    config.table
                );
            }
            Ok(())
        }
        Command::Publish(args) => publish::run(&config, args, json).await,
        Command::Work(args) => work::run(&config, args, json).await,
        Command::Stats(args) => stats::run(&config, args, json).await,
        Command::Dead { command } => dead::run(&config, command, json).await,
        Command::Demo(args) => demo::run(&config, args, json).await,
        Command::Bench(args) => bench::run(&config, args, json).await,
        Command::Relay(args) => relay::run(&config, args, json).await,
        Command::Move(args) => move_cmd::run(&config, args, json).await,
        Command::Prune(args) => prune::run(&config, args, json).await,
        Command::Job(args) => job::run(&config, &args.id, json).await,
        Command::Serve(args) => serve::run(&config, args).await,
    }
}

/// Where the selected backend lives (password hidden): `DATABASE_URL` or `AMQP_URL`.
pub(crate) fn store_url(config: &Config) -> String {
    store_url_of(config, config.backend)
}

/// Where backend `kind` lives (password hidden).
pub(crate) fn store_url_of(config: &Config, kind: BackendKind) -> String {
    match kind {
        BackendKind::Exec => config.database_url.to_string(),
        BackendKind::RabbitMq => config.amqp_url.to_string(),
    }
}

/// The configuration: each flag over its environment variable.
fn config(global: &Global) -> Result<Config> {
    let flags = [
        ("QUEUE_BACKEND", &global.backend),
        ("DATABASE_URL", &global.database_url),
        ("AMQP_URL", &global.amqp_url),
        ("QUEUE_CLAIM", &global.claim),
        ("QUEUE_VISIBILITY_TIMEOUT", &global.visibility_timeout),
        ("QUEUE_TABLE", &global.table),
        ("QUEUE_SCHEMA", &global.schema),
    ];
    Ok(Config::from_lookup(|var| {
        flags
            .iter()
            .find(|(name, _)| *name == var)
            .and_then(|(_, flag)| (*flag).clone())
            .or_else(|| std::env::var(var).ok())
    })?)
}

/// Validates an optional `--queue`.
fn queue_arg(queue: Option<&str>) -> Result<Option<QueueName>> {
    Ok(queue.map(QueueName::new).transpose()?)
}

/// The error for a queue named on the command line that the broker does not have. On
/// RabbitMQ a queue is an object of the broker, so an unknown name is most likely a
/// typo, which a script should not read as "empty". In a SQL table a queue is only a
/// column value, so an unknown name there is indistinguishable from a drained queue.
fn missing_broker_queue(queue: &QueueName) -> switchyard::Error {
    switchyard::ConfigError::new(
        "--queue",
        Some(queue.as_str().to_owned()),
        "a queue that exists on RabbitMQ; the broker has no queue of this name (it is declared by the first publish or worker; nothing was created): check the name",
    )
    .into()
}
