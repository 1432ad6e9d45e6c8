//! Pickup with the publisher in another process, as a web process publishing to a
//! worker process is: the bench runs itself again as `switchyard bench-publish`, which
//! stamps each job with the time it published it, read by the same clock as the
//! worker's (one machine).

use std::process::Stdio;
use std::time::Duration;

use switchyard::{BackendKind, Config, Envelope, Error, Result, TransportExt};

use crate::cli::BenchPublishArgs;

/// The header holding a job's publish time, ns since the epoch.
pub(super) const SENT_NS: &str = "switchyard-bench-sent-ns";

/// Now, in ns since the epoch.
pub(super) fn now_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX)
}

/// `envelope` stamped with the time now.
pub(super) fn stamped(mut envelope: Envelope) -> Envelope {
    envelope
        .headers
        .insert(SENT_NS.to_owned(), now_ns().to_string());
    envelope
}

/// The publisher process: `count` jobs to `queue`, one every `interval_ms`, each stamped.
pub(crate) async fn publish_timed(config: &Config, args: BenchPublishArgs) -> Result<()> {
    let t = open(config).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms.max(1)));
    for _ in 0..args.count {
        tick.tick().await;
        let env = Envelope::builder(args.queue.clone(), "noop").build()?;
        t.publish(stamped(env)).await?;
    }
    Ok(())
}

/// The store as the bench's own transports open it: on RabbitMQ its queues expire after
/// an idle hour (a publisher declaring them otherwise is refused by the broker).
pub(super) async fn open(config: &Config) -> Result<std::sync::Arc<dyn switchyard::Transport>> {
    #[cfg(feature = "amqp")]
    if config.backend == BackendKind::RabbitMq {
        let options = switchyard::AmqpOptions::from_config(config)
            .with_queue_expires(Duration::from_secs(3600));
        return Ok(std::sync::Arc::new(
            switchyard::AmqpTransport::connect(options).await?,
        ));
    }
    switchyard::connect_existing(config).await
}

/// Starts the publisher process for `queue` on the store `config` describes.
pub(super) fn spawn(
    config: &Config,
    queue: &str,
    count: usize,
    interval: Duration,
) -> Result<tokio::process::Child> {
    let mut cmd = command(
        config,
        &[
            "bench-publish",
            "--queue",
            queue,
            "--count",
            &count.to_string(),
            "--interval-ms",
            &interval.as_millis().to_string(),
        ],
    )?;
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    cmd.spawn()
        .map_err(|e| Error::io("starting the publisher process", e))
}

/// This binary run again with `args` on the store `config` describes (one backend, no
/// migration), killed should the bench drop it.
pub(super) fn command(config: &Config, args: &[&str]) -> Result<tokio::process::Command> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("finding the switchyard binary for a bench process", e))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .env("DATABASE_URL", config.database_url.expose())
        .env("QUEUE_TABLE", config.table.as_str())
        .env("QUEUE_CLAIM", config.claim.to_string())
        .env("QUEUE_CANARY_PERCENT", "0")
        .env("QUEUE_DRAIN", "none")
        .env_remove("QUEUE_SCHEMA")
        .kill_on_drop(true);
    if let Some(schema) = &config.schema {
        cmd.env("QUEUE_SCHEMA", schema.as_str());
    }
    if config.backend == BackendKind::RabbitMq {
        cmd.env("QUEUE_BACKEND", "rabbitmq")
            .env("AMQP_URL", config.amqp_url.expose());
    } else {
        cmd.env("QUEUE_BACKEND", "exec");
    }
    Ok(cmd)
}
