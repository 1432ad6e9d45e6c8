//! Wake-ups for publishes of other processes. MySQL has no `NOTIFY`, so once a worker of
//! this transport has asked for a wake-up signal, one task per transport reads the newest
//! row's seq (`MAX(seq)`, the last entry of the primary key) every few milliseconds on a
//! connection of its own; when it grew, it reads which queues the new rows are on and
//! wakes their idle workers. One cheap statement per interval per process, however many
//! workers and queues wait, and none while every claim of this transport finds work
//! ([`run_watch`] paces it). The workers' own polling stays the truth: due delays,
//! releases and lapsed leases add no row, and a row committed after a newer one was seen
//! is found by it too.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::sql::watch_loop::{run_watch, Look};
use queue_core::sql::{lossy, Wakers};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection};
use tokio_util::sync::CancellationToken;

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
    let look = MySqlLook {
        connect,
        sql,
        conn: None,
        last: None,
    };
    run_watch(look, every, wakers, stop).await;
}

/// The watch's connection and the newest seq it saw (`None` after a connect).
struct MySqlLook {
    connect: MySqlConnectOptions,
    sql: WatchSql,
    conn: Option<MySqlConnection>,
    last: Option<i64>,
}

#[async_trait]
impl Look for MySqlLook {
    async fn ask(&mut self, wakers: &Wakers) -> Result<(), Box<dyn fmt::Display + Send>> {
        self.read(wakers)
            .await
            .map_err(|e| Box::new(e) as Box<dyn fmt::Display + Send>)
    }

    async fn disconnect(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = c.close().await;
        }
    }
}

impl MySqlLook {
    /// One read: connects when needed, and wakes the queues of rows newer than the last
    /// seen.
    async fn read(&mut self, wakers: &Wakers) -> Result<(), sqlx::Error> {
        if self.conn.is_none() {
            self.conn = Some(MySqlConnection::connect_with(&self.connect).await?);
            // Publishes may have come in while there was no connection.
            self.last = None;
        }
        let Some(c) = self.conn.as_mut() else {
            return Ok(());
        };
        let newest: i64 = sqlx::query_scalar(&self.sql.max_seq)
            .fetch_one(&mut *c)
            .await?;
        match self.last {
            Some(seen) if newest > seen => {
                let queues: Vec<Vec<u8>> = sqlx::query_scalar(&self.sql.queues_between)
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
        self.last = Some(newest);
        Ok(())
    }
}
