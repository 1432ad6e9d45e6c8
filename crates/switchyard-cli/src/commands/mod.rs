//! One module per command.

mod baseline;
mod bench;
mod dead;
mod demo;
mod publish;
mod stats;
mod work;

use switchyard::{Config, QueueName, Result};

use crate::cli::{Cli, Command, Global};

pub(crate) async fn run(cli: Cli) -> Result<()> {
    let config = config(&cli.global)?;
    let json = cli.global.json;
    match cli.command {
        Command::Migrate => {
            let t = switchyard::connect(&config).await?;
            if json {
                crate::output::json_line(&serde_json::json!({
                    "migrated": true,
                    "backend": t.name(),
                    "database_url": config.database_url.to_string(),
                    "table": config.table.as_str(),
                }))?;
            } else {
                println!(
                    "{} is ready: {} (table {})",
                    t.name(),
                    config.database_url,
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
