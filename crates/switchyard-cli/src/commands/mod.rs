//! One module per command.

mod bench;
mod common;
mod control;
mod dead;
mod demo;
mod forward;
mod job;
mod migrate;
mod move_cmd;
mod prune;
mod publish;
mod relay;
mod report;
mod schedule;
mod serve;
mod stats;
mod work;

use switchyard::{Config, Result};

use crate::cli::{Cli, Command, DeadCommand, Global};

pub(crate) async fn run(cli: Cli) -> Result<()> {
    // Run by an exec command: it talks to its worker, not to a store.
    if let Command::Progress(args) = cli.command {
        return report::progress(args).await;
    }
    if let Command::Checkpoint(args) = cli.command {
        return report::checkpoint(args).await;
    }
    let config = config(&cli.global)?;
    let json = cli.global.json;
    // Only these serve several tenants; every other command acts on one store, and
    // must not reach a shared one (bench and demo build their transports themselves).
    let several_ok = matches!(
        cli.command,
        Command::Work(_)
            | Command::Stats(_)
            | Command::Dead {
                command: DeadCommand::List { .. }
            }
    );
    if let (Some(selection), false) = (&config.tenants, several_ok) {
        return Err(switchyard::several_tenants_error(selection));
    }
    match cli.command {
        Command::Migrate => migrate::run(&config, json).await,
        Command::Publish(args) => publish::run(&config, args, json).await,
        Command::Work(args) => work::run(&config, args, json).await,
        Command::Stats(args) => {
            each_tenant(&config, json, async |c| {
                stats::run(c, args.clone(), json).await
            })
            .await
        }
        Command::Dead {
            command: command @ DeadCommand::List { .. },
        } => {
            each_tenant(&config, json, async |c| {
                dead::run(c, command.clone(), json).await
            })
            .await
        }
        Command::Dead { command } => dead::run(&config, command, json).await,
        Command::Demo(args) => demo::run(&config, args, json).await,
        Command::Bench(args) => bench::run(&config, args, json).await,
        Command::BenchPublish(args) => bench::publish_timed(&config, args).await,
        Command::BenchDrain(args) => bench::drain_in_process(&config, args).await,
        Command::Relay(args) => relay::run(&config, args, json).await,
        Command::Move(args) => move_cmd::run(&config, args, json).await,
        Command::Prune(args) => prune::run(&config, args, json).await,
        Command::Job(args) => job::run(&config, &args.id, json).await,
        Command::Serve(args) => serve::run(&config, args).await,
        Command::Pause(args) => control::pause(&config, args, json).await,
        Command::Resume(args) => control::resume(&config, args, json).await,
        Command::Cancel(args) => control::cancel(&config, args, json).await,
        Command::Schedule { command } => schedule::run(&config, command, json).await,
        Command::Progress(args) => report::progress(args).await,
        Command::Checkpoint(args) => report::checkpoint(args).await,
    }
}

/// Runs a reading command once per tenant when `--schema` names several (the text
/// output of each under a `tenant NAME` line; its JSON says the tenant), else once.
async fn each_tenant(
    config: &Config,
    json: bool,
    run: impl AsyncFn(&Config) -> Result<()>,
) -> Result<()> {
    let Some(selection) = &config.tenants else {
        return run(config).await;
    };
    let tenants = switchyard::tenants::tenant_configs(config).await?;
    if tenants.is_empty() {
        return Err(switchyard::ConfigError::new(
            "QUEUE_SCHEMA",
            Some(selection.to_string()),
            "a pattern that matches at least one tenant's store; none does",
        )
        .into());
    }
    for (i, tenant) in tenants.iter().enumerate() {
        if !json {
            if i > 0 {
                outln!();
            }
            let name = tenant.tenant.as_ref().map_or("", |t| t.as_str());
            outln!("tenant {name}");
        }
        run(tenant).await?;
    }
    Ok(())
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
