//! Wake-ups for publishes of other processes. MySQL has no `NOTIFY`, so once a worker of
//! this transport has asked for a wake-up signal, one task per transport reads the newest
//! row's seq (`MAX(seq)`, the last entry of the primary key) every few milliseconds on a
//! connection of its own; when it grew, it reads which queues the new rows are on and
//! wakes their idle workers. One cheap statement per interval per process, however many
//! workers and queues wait, and none while every claim of this transport finds work. The workers' own polling stays the truth: due delays,
//! releases and lapsed leases add no row, and a row committed after a newer one was seen
//! is found by it too.

use std::sync::Arc;
use std::time::Duration;

use queue_core::sql::{lossy, Wakers};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection};
use tokio_util::sync::CancellationToken;

/// The longest a connect or a read of the watch may take before it is given up.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Backoff after a failure: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// The statements of the watch: the newest seq, and the queues of rows in a seq range.
#[derive(Debug, Clone)]
pub(crate) struct WatchSql {
    pub(crate) max_seq: String,
    pub(crate) queues_between: String,
}

/// Watches until `stop`, reading every `every`.
pub(crate) async fn watch_publishes(
    connect: MySqlConnectOptions,
    sql: WatchSql,
    every: Duration,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(1));
    let mut conn: Option<MySqlConnection> = None;
    let mut last: Option<i64> = None;
    let mut pause = every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let step = tokio::select! {
            _ = stop.cancelled() => break,
            step = tokio::time::timeout(STATEMENT_TIMEOUT, tick(&connect, &sql, &mut conn, &mut last, &wakers)) => step,
        };
        pause = match step {
            Ok(Ok(())) => every,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "publish watch failed; the workers poll meanwhile");
                conn = None;
                (pause * 2).clamp(BACKOFF.0, BACKOFF.1)
            }
            Err(_) => {
                tracing::debug!("publish watch timed out; the workers poll meanwhile");
                conn = None;
                (pause * 2).clamp(BACKOFF.0, BACKOFF.1)
            }
        };
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}

/// One read: connects when needed, and wakes the queues of rows newer than `last`.
async fn tick(
    connect: &MySqlConnectOptions,
    sql: &WatchSql,
    conn: &mut Option<MySqlConnection>,
    last: &mut Option<i64>,
    wakers: &Wakers,
) -> Result<(), sqlx::Error> {
    // While every claim finds work no worker waits for a wake-up.
    if !wakers.any_idle() {
        return Ok(());
    }
    if conn.is_none() {
        *conn = Some(MySqlConnection::connect_with(connect).await?);
        // Publishes may have come in while there was no connection.
        *last = None;
    }
    let Some(c) = conn.as_mut() else {
        return Ok(());
    };
    let newest: i64 = sqlx::query_scalar(&sql.max_seq).fetch_one(&mut *c).await?;
    match *last {
        Some(seen) if newest > seen => {
            let queues: Vec<Vec<u8>> = sqlx::query_scalar(&sql.queues_between)
                .bind(seen)
                .bind(newest)
                .fetch_all(&mut *c)
                .await?;
            let queues: Vec<String> = queues.into_iter().map(lossy).collect();
            wakers.wake_each(queues.iter().map(String::as_str));
        }
        Some(_) => {}
        None => wakers.wake_all(),
    }
    *last = Some(newest);
    Ok(())
}
