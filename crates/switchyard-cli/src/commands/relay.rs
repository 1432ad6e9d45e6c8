//! `switchyard relay --queue Q`: the transactional outbox's relay. Messages committed to
//! the SQL store (with the application's own transaction, through `publish_tx`) are
//! forwarded to RabbitMQ with confirms and only then removed from the store: a relay
//! that dies between the two leaves them leased, and once the lease runs out they are
//! forwarded again, with the same id. At least once, never lost.

use std::time::{Duration, Instant};

use switchyard::{
    BackendKind, CancellationToken, Config, QueueName, Result, Transport, TransportExt,
};

use super::forward::publish_forwarded;
use crate::cli::RelayArgs;

/// The longest pause between looks at an empty outbox.
const MAX_IDLE: Duration = Duration::from_secs(1);

pub(crate) async fn run(config: &Config, args: RelayArgs, json: bool) -> Result<()> {
    let queue = QueueName::new(args.queue.clone())
        .map_err(|e| switchyard::ConfigError::new("--queue", e.value, e.expected))?;
    let outbox = switchyard::connect_backend(config, BackendKind::Exec, false).await?;
    let broker = switchyard::connect_backend(config, BackendKind::RabbitMq, true).await?;
    let (shutdown, abort) = (CancellationToken::new(), CancellationToken::new());
    crate::signals::spawn_signal_handler(shutdown.clone(), abort)?;
    let started = Instant::now();
    let relayed = relay(
        outbox.as_ref(),
        broker.as_ref(),
        &queue,
        args.batch.max(1),
        args.drain,
        &shutdown,
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    if json {
        crate::output::json_line(&serde_json::json!({
            "queue": queue.as_str(),
            "relayed": relayed,
            "seconds": secs,
        }))
    } else {
        outln!(
            "relayed {relayed} messages from {} to RabbitMQ in {secs:.1} s",
            super::common::store_url_of(config, BackendKind::Exec)
        );
        Ok(())
    }
}

/// Forwards batches until `shutdown` (or, with `drain`, until the outbox is empty);
/// how many were forwarded. Backend errors are logged and retried after a pause.
async fn relay(
    outbox: &dyn Transport,
    broker: &dyn Transport,
    queue: &QueueName,
    batch: usize,
    drain: bool,
    shutdown: &CancellationToken,
) -> Result<u64> {
    let waker = outbox.wake_signal(queue);
    let mut relayed = 0u64;
    let mut idle = Duration::from_millis(20);
    while !shutdown.is_cancelled() {
        // A prefetch: a relay that dies holding the batch charges its messages no attempt.
        let taken = match outbox.prefetch_batch(queue, batch).await {
            Ok(taken) => taken,
            Err(err) => {
                tracing::warn!(error = %err, "relay: reading the outbox failed; retrying");
                pause(shutdown, Duration::from_secs(1)).await;
                continue;
            }
        };
        if taken.is_empty() {
            if drain && nothing_left(outbox, queue).await? {
                break;
            }
            let woken = async {
                match &waker {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(idle) => {}
                () = woken => {}
            }
            idle = (idle * 2).min(MAX_IDLE);
            continue;
        }
        idle = Duration::from_millis(20);
        // A message the broker cannot keep as asked would be refused on every try and
        // hold up the outbox behind it: it is dead-lettered there, saying why.
        let taken = set_aside_unsupported(outbox, broker, taken).await;
        if taken.is_empty() {
            continue;
        }
        // The envelopes as stored: same ids, attempts, due times, headers. A unique key
        // held while the message waited in the outbox; the broker keeps it further only
        // where it can (with its control store, and never a debounce), and one it holds
        // for another job is left behind: the message was accepted, and is forwarded.
        let envelopes = taken.iter().map(|r| r.envelope.clone()).collect();
        if let Err(err) = publish_forwarded(broker, envelopes, "relay").await {
            // Not all confirmed: give them back for the next try (those the broker did
            // confirm are then forwarded twice, with the same ids).
            tracing::warn!(error = %err, "relay: publishing to RabbitMQ failed; retrying");
            for r in &taken {
                if let Err(err) = outbox.abandon(r).await {
                    tracing::warn!(message_id = %r.id(), error = %err, "relay: could not give a message back; it returns when its lease runs out");
                }
            }
            pause(shutdown, Duration::from_secs(1)).await;
            continue;
        }
        // Confirmed by the broker: now they may leave the outbox. If this fails, or a
        // lease ran out, they are forwarded again later, with the same ids.
        match outbox.ack_batch(&taken).await {
            Ok(report) => {
                relayed += report.acked.len() as u64;
                if !report.lost.is_empty() {
                    tracing::warn!(lost = report.lost.len(), "relay: leases ran out before the ack; those messages may be forwarded twice");
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "relay: removing a forwarded batch from the outbox failed; it will be forwarded again");
                pause(shutdown, Duration::from_secs(1)).await;
            }
        }
    }
    Ok(relayed)
}

/// Dead-letters in the outbox the messages `broker` would refuse (ordering keys where it
/// cannot keep them), and returns the rest.
async fn set_aside_unsupported(
    outbox: &dyn Transport,
    broker: &dyn Transport,
    taken: Vec<switchyard::Reservation>,
) -> Vec<switchyard::Reservation> {
    if broker.capabilities().ordering_keys {
        return taken;
    }
    let (keyed, rest): (Vec<_>, Vec<_>) = taken
        .into_iter()
        .partition(|r| r.envelope.ordering_key.is_some());
    for r in &keyed {
        let why = format!(
            "not relayed: {} cannot keep the order of ordering key {:?}; publish it to a SQL backend, or without a key",
            broker.name(),
            r.envelope.ordering_key.as_deref().unwrap_or_default()
        );
        tracing::warn!(message_id = %r.id(), "relay: {why}");
        if let Err(err) = outbox
            .dead_letter(r, switchyard::reason::UNSUPPORTED, Some(&why))
            .await
        {
            tracing::warn!(message_id = %r.id(), error = %err, "relay: could not dead-letter a message the broker refuses; it returns when its lease runs out");
        }
    }
    rest
}

async fn pause(shutdown: &CancellationToken, d: Duration) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(d) => {}
    }
}

async fn nothing_left(outbox: &dyn Transport, queue: &QueueName) -> Result<bool> {
    Ok(outbox
        .stats(Some(queue))
        .await?
        .iter()
        .filter(|s| s.queue == queue.as_str())
        .all(|s| s.ready + s.delayed + s.reserved == 0))
}
