//! The pickup floor: what a bare consumer on the bench's server gets for a message
//! published while it waits, measured in the same run, so that the queue's pickup reads
//! as a ratio to what the machine allows rather than against a fixed figure.
//!
//! - PostgreSQL: the publisher inserts a row and calls `pg_notify` in one statement (one
//!   commit); a `LISTEN` connection hears it, and the consumer claims with the bare
//!   drain's `UPDATE … RETURNING` (another commit).
//! - RabbitMQ: a persistent publish to a quorum queue, waiting for its confirm, and a
//!   consumer with a prefetch of 100 that acks each delivery.
//!
//! Publisher and consumer share the bench's process, as in its same-process pickup, at
//! the same rate and count. Each message carries its publish time, read back by the
//! consumer from the same clock.

use std::time::Duration;

use switchyard::{Error, Result};

use super::remote::now_ns;
use super::workload::{percentiles, PICKUP_INTERVAL, PICKUP_MESSAGES};

/// How long the consumer may take to see every message once the last is published.
const SETTLE: Duration = Duration::from_secs(60);

fn err(e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("bench pickup floor: {e}"))
}

/// The time from `sent` (ns since the epoch) to now, if the clock did not step back.
fn since(sent: i64) -> Option<Duration> {
    u64::try_from(now_ns() - sent)
        .ok()
        .map(Duration::from_nanos)
}

/// Waits for the consumer's outcome, aborting it on a timeout.
async fn collected<T>(consumer: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    let abort = consumer.abort_handle();
    match tokio::time::timeout(SETTLE, consumer).await {
        Ok(joined) => joined.map_err(err)?,
        Err(_) => {
            abort.abort();
            Err(err("the consumer did not see every message within 60 s"))
        }
    }
}

/// Pickup p50 and p99 (ms) of bare `LISTEN` and one claim, in `table` (the bare
/// baseline's: `queue`, `payload jsonb`, `run_at`, `claimed_at`).
#[cfg(feature = "postgres")]
pub(super) async fn postgres(pool: &sqlx::PgPool, table: &str) -> Result<(f64, f64)> {
    let channel = format!("bench_bare_{}", uuid::Uuid::new_v4().simple());
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .map_err(err)?;
    listener.listen(&channel).await.map_err(err)?;
    let claim = format!(
        "UPDATE {table} SET claimed_at = now() WHERE id IN (SELECT id FROM {table} \
         WHERE queue = 'pickup' AND claimed_at IS NULL ORDER BY run_at, id \
         LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING (payload->>'sent')::bigint"
    );
    let consumer = tokio::spawn({
        let pool = pool.clone();
        async move {
            let (mut latencies, mut seen) = (Vec::with_capacity(PICKUP_MESSAGES), 0);
            while seen < PICKUP_MESSAGES {
                listener.recv().await.map_err(err)?;
                let sent: Vec<i64> = sqlx::query_scalar(&claim)
                    .fetch_all(&pool)
                    .await
                    .map_err(err)?;
                seen += sent.len();
                latencies.extend(sent.into_iter().filter_map(since));
            }
            Ok(latencies)
        }
    });
    let publish = format!(
        "WITH ins AS (INSERT INTO {table} (queue, payload) VALUES ('pickup', $1::jsonb) \
         RETURNING id) SELECT pg_notify('{channel}', '') FROM ins"
    );
    let mut tick = tokio::time::interval(PICKUP_INTERVAL);
    for _ in 0..PICKUP_MESSAGES {
        tick.tick().await;
        let sent = serde_json::json!({ "sent": now_ns() }).to_string();
        if let Err(e) = sqlx::query(&publish).bind(sent).execute(pool).await {
            consumer.abort();
            return Err(err(e));
        }
    }
    Ok(percentiles(collected(consumer).await?))
}

/// Pickup p50 and p99 (ms) of a bare lapin consumer on `queue` (an empty quorum queue),
/// each publish waiting for its confirm.
#[cfg(feature = "amqp")]
pub(super) async fn amqp(conn: &lapin::Connection, queue: &str) -> Result<(f64, f64)> {
    use futures_lite::StreamExt;
    use lapin::options::{BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions};
    use lapin::BasicProperties;

    let (consuming, mut deliveries) = bare_consumer(conn, queue).await?;
    let consumer = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(PICKUP_MESSAGES);
        for _ in 0..PICKUP_MESSAGES {
            let Some(delivery) = deliveries.next().await else {
                return Err(err("the consumer ended early"));
            };
            let delivery = delivery.map_err(err)?;
            let sent = std::str::from_utf8(&delivery.data)
                .ok()
                .and_then(|s| s.parse::<i64>().ok());
            latencies.extend(sent.and_then(since));
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(err)?;
        }
        Ok((latencies, deliveries))
    });
    let publishing = conn.create_channel().await.map_err(err)?;
    publishing
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(err)?;
    let mut tick = tokio::time::interval(PICKUP_INTERVAL);
    for _ in 0..PICKUP_MESSAGES {
        tick.tick().await;
        let published = async {
            publishing
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    now_ns().to_string().as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?
                .await
        };
        if let Err(e) = published.await {
            consumer.abort();
            return Err(err(e));
        }
    }
    let (latencies, deliveries) = collected(consumer).await?;
    cancel(&consuming, deliveries).await?;
    Ok(percentiles(latencies))
}

/// Cancels `consumer` and waits for the broker's answer: a consumer left to its drop is
/// cancelled in the background, and a channel closed meanwhile receives the answer
/// unexpectedly, which fails the whole connection.
#[cfg(feature = "amqp")]
pub(super) async fn cancel(channel: &lapin::Channel, consumer: lapin::Consumer) -> Result<()> {
    channel
        .basic_cancel(
            consumer.tag(),
            lapin::options::BasicCancelOptions::default(),
        )
        .await
        .map_err(err)
}

/// A channel with a prefetch of 100 consuming `queue`: the bare drain's consumer and the
/// bare pickup's.
#[cfg(feature = "amqp")]
pub(super) async fn bare_consumer(
    conn: &lapin::Connection,
    queue: &str,
) -> Result<(lapin::Channel, lapin::Consumer)> {
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use lapin::types::FieldTable;

    let channel = conn.create_channel().await.map_err(err)?;
    channel
        .basic_qos(100, BasicQosOptions::default())
        .await
        .map_err(err)?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
    Ok((channel, consumer))
}
