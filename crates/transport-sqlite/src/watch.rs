//! Wake-ups for publishes of other processes on the same file. SQLite tells a connection
//! of nothing another one commits, so once a worker of this transport has asked for a
//! wake-up signal, one task per transport looks at the database's files every few
//! milliseconds: a `stat` of the write-ahead log and of the database file, which costs
//! no query while nothing changes. When either changed (a commit appends to the log; a
//! checkpoint copies it into the file and starts it over), it reads the newest row's seq
//! on a connection of its own and, when that grew, which queues the new rows are on, and
//! wakes their idle workers; and reads once more at the next look, since a commit's log
//! is written a moment before the commit is visible. Its statements are not cached: a
//! cached one is not reset when done, and would hold its read snapshot.
//!
//! A file replaced under its path (a restore) is seen by its inode: the watch opens the
//! new one, and wakes every idle worker. The workers' own polling stays the truth: due
//! delays, releases and lapsed leases add no row.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use queue_core::sql::{lossy, Wakers};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
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

/// What the files looked like: the log's length and time, the file's time and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Look {
    log: Option<(u64, SystemTime)>,
    file: Option<(SystemTime, u64)>,
}

fn look(path: &Path, log: &Path) -> Look {
    use std::os::unix::fs::MetadataExt as _;
    let log = std::fs::metadata(log)
        .ok()
        .and_then(|m| Some((m.len(), m.modified().ok()?)));
    let file = std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.ino())));
    Look { log, file }
}

/// The watch's state between looks.
struct Watch {
    connect: SqliteConnectOptions,
    path: PathBuf,
    log: PathBuf,
    sql: WatchSql,
    conn: Option<(SqliteConnection, u64)>,
    /// The newest seq seen; `None` after a (re)connect.
    last: Option<i64>,
    /// The files as last read after, and whether a second read confirmed them: a commit
    /// writes its log before it is visible, so the read right after a change may come
    /// too soon.
    seen: Option<Look>,
    settled: bool,
}

/// Watches the file at `path` until `stop`, looking every `every`.
pub(crate) async fn watch_publishes(
    connect: SqliteConnectOptions,
    path: PathBuf,
    sql: WatchSql,
    every: Duration,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(1));
    let mut log = path.clone().into_os_string();
    log.push("-wal");
    let mut watch = Watch {
        connect: connect.create_if_missing(false),
        log: PathBuf::from(log),
        path,
        sql,
        conn: None,
        last: None,
        seen: None,
        settled: false,
    };
    let mut pause = every;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let step = tokio::select! {
            _ = stop.cancelled() => break,
            step = tokio::time::timeout(STATEMENT_TIMEOUT, watch.tick(&wakers)) => step,
        };
        pause = match step {
            Ok(Ok(())) => every,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "publish watch failed; the workers poll meanwhile");
                watch.conn = None;
                (pause * 2).clamp(BACKOFF.0, BACKOFF.1)
            }
            Err(_) => {
                tracing::debug!("publish watch timed out; the workers poll meanwhile");
                watch.conn = None;
                (pause * 2).clamp(BACKOFF.0, BACKOFF.1)
            }
        };
    }
    if let Some((c, _)) = watch.conn {
        let _ = c.close().await;
    }
}

impl Watch {
    /// One look: reads only when a file changed, and wakes the queues of rows newer than
    /// the last seen.
    async fn tick(&mut self, wakers: &Wakers) -> Result<(), sqlx::Error> {
        // Taken before the read: a commit after it changes the files again.
        let now = look(&self.path, &self.log);
        let inode = now.file.map(|(_, ino)| ino);
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, ino)| Some(*ino) != inode)
        {
            tracing::info!(path = %self.path.display(), "the database file was replaced; watching the new one");
            if let Some((c, _)) = self.conn.take() {
                let _ = c.close().await;
            }
        }
        if self.conn.is_none() {
            let Some(ino) = inode else {
                return Ok(());
            };
            let c = SqliteConnection::connect_with(&self.connect).await?;
            self.conn = Some((c, ino));
            // Publishes may have come in while there was no connection.
            self.last = None;
            self.seen = None;
        }
        if self.seen == Some(now) {
            if self.settled {
                return Ok(());
            }
            self.settled = true;
        } else {
            self.settled = false;
        }
        let Some((c, _)) = self.conn.as_mut() else {
            return Ok(());
        };
        // Statements not kept: a cached one is not reset when done, and would hold its
        // read snapshot, so that the next look saw nothing newer.
        let newest: i64 = sqlx::query_scalar(&self.sql.max_seq)
            .persistent(false)
            .fetch_all(&mut *c)
            .await?
            .first()
            .copied()
            .unwrap_or(0);
        match self.last {
            Some(seen) if newest > seen => {
                let queues: Vec<Vec<u8>> = sqlx::query_scalar(&self.sql.queues_between)
                    .persistent(false)
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
        self.seen = Some(now);
        Ok(())
    }
}
