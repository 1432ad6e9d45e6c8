//! `switchyard stats`.

use switchyard::{Config, Result};

use crate::cli::StatsArgs;
use crate::output::human_duration;

pub(crate) async fn run(config: &Config, args: StatsArgs, json: bool) -> Result<()> {
    let queue = super::queue_arg(args.queue.as_deref())?;
    let transport = switchyard::connect_existing(config).await?;
    let stats = transport.stats(queue.as_ref()).await?;
    // RabbitMQ keeps delayed messages in a chain shared by every queue: only the
    // process that delayed them counts them, and this one delayed none.
    let delayed_counted = transport.capabilities().delayed_stats;
    if json {
        return crate::output::json_line(&serde_json::json!({
            "backend": transport.name(),
            "delayed_counted": delayed_counted,
            "queues": stats,
        }));
    }
    if stats.is_empty() {
        println!(
            "no messages on {} ({})",
            transport.name(),
            super::store_url(config)
        );
        return Ok(());
    }
    println!(
        "{:<32} {:>10} {:>10} {:>10} {:>10} {:>14}",
        "QUEUE", "READY", "DELAYED", "RESERVED", "DEAD", "OLDEST READY"
    );
    for s in stats {
        println!(
            "{:<32} {:>10} {:>10} {:>10} {:>10} {:>14}",
            s.queue,
            s.ready,
            if delayed_counted {
                s.delayed.to_string()
            } else {
                "-".into()
            },
            s.reserved,
            s.dead,
            s.oldest_ready_age
                .map(human_duration)
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}
