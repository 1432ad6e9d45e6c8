//! Wake-ups for publishes of other processes. MySQL has no `NOTIFY`, so while a worker
//! of this transport waits for messages, one task per transport reads the newest row's
//! seq (`MAX(seq)`, the last entry of the primary key) every few milliseconds on a
//! connection of its own, and wakes every idle worker of the transport when it grew. One
//! cheap statement per interval per process, however many workers and queues wait; the
//! workers' own polling stays the truth (due delays, releases and lapsed leases add no
//! row and are found by it).

use std::sync::Arc;
use std::time::Duration;

use queue_core::sql::Wakers;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection};
use tokio_util::sync::CancellationToken;

/// Reads `max_seq` (a statement returning one BIGINT) every `every` until `stop`, and
/// wakes `wakers` whenever the value grew. A failed read drops the connection; the next
/// tick connects again.
pub(crate) async fn watch_publishes(
    connect: MySqlConnectOptions,
    max_seq: String,
    every: Duration,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
) {
    let mut conn: Option<MySqlConnection> = None;
    let mut last: Option<i64> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            match MySqlConnection::connect_with(&connect).await {
                Ok(c) => conn = Some(c),
                Err(err) => {
                    tracing::debug!(error = %err, "publish watch: cannot connect; polling only");
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match sqlx::query_scalar::<_, i64>(&max_seq).fetch_one(c).await {
            Ok(seq) => {
                // Also after a reconnect: publishes may have come in meanwhile.
                if last.is_none_or(|l| seq > l) {
                    wakers.wake_all();
                }
                last = Some(seq);
            }
            Err(err) => {
                tracing::debug!(error = %err, "publish watch: read failed; reconnecting");
                conn = None;
                last = None;
            }
        }
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}
