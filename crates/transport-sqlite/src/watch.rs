//! Wake-ups for publishes of other processes on the same file. SQLite tells a connection
//! of nothing another one commits, so once a worker of this transport has asked for a
//! wake-up signal, one task per transport looks every few milliseconds at the header of
//! the write-ahead log's index (the first 48 bytes of the `-shm` file: its change
//! counter, last frame and salts), which every writer updates in the moment its commit
//! becomes visible, and which costs one `pread` and no query while nothing changes.
//! When it changed, the watch reads the newest row's seq on a connection of its own and,
//! when that grew, which queues the new rows are on, and wakes their idle workers; it
//! reads once more at the next look, so that a commit published between the look and
//! the read is not left behind.
//!
//! A file replaced under its path (a restore) is seen by its inode: the watch opens the
//! new one and wakes every idle worker, and warns that this process's own connections
//! still use the old file (restart it). The workers' own polling stays the truth: due
//! delays, releases and lapsed leases add no row.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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

/// The bytes of the log index's header that change with every visible commit.
const HEADER: usize = 48;

/// What the files looked like: the log index's header, and the file's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Look {
    header: Option<[u8; HEADER]>,
    file: Option<u64>,
}

fn look(path: &Path, index: &Path) -> Look {
    let header = std::fs::File::open(index).ok().and_then(|f| {
        let mut bytes = [0u8; HEADER];
        read_at(&f, &mut bytes).ok().map(|()| bytes)
    });
    Look {
        header,
        file: identity(path),
    }
}

#[cfg(unix)]
fn read_at(f: &std::fs::File, bytes: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, bytes, 0)
}

#[cfg(not(unix))]
fn read_at(mut f: &std::fs::File, bytes: &mut [u8]) -> std::io::Result<()> {
    std::io::Read::read_exact(&mut f, bytes)
}

/// The file's inode (where there are inodes): a file replaced under its path has
/// another.
#[cfg(unix)]
fn identity(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

#[cfg(not(unix))]
fn identity(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|_| 0)
}

/// The watch's state between looks.
struct Watch {
    connect: SqliteConnectOptions,
    path: PathBuf,
    index: PathBuf,
    sql: WatchSql,
    conn: Option<(SqliteConnection, u64)>,
    /// The newest seq seen; `None` after a (re)connect.
    last: Option<i64>,
    /// The files as last read after, and whether a second read confirmed them: a commit
    /// made visible between a look and its read is found by the next read.
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
    // SQLite names the log's index after the file a symbolic link leads to.
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let mut index = path.clone().into_os_string();
    index.push("-shm");
    let mut watch = Watch {
        connect: connect.create_if_missing(false),
        index: PathBuf::from(index),
        path,
        sql,
        conn: None,
        last: None,
        seen: None,
        settled: false,
    };
    let mut pause = every;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let step = tokio::select! {
            _ = stop.cancelled() => break,
            step = tokio::time::timeout(STATEMENT_TIMEOUT, watch.tick(&wakers)) => step,
        };
        let failed = match step {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(err.to_string()),
            Err(_) => Some(format!("no answer within {STATEMENT_TIMEOUT:?}")),
        };
        pause = match failed {
            None => {
                failures = 0;
                every
            }
            Some(why) => {
                failures += 1;
                // Said once when it keeps failing: the workers' polling covers meanwhile.
                if failures == 5 {
                    tracing::warn!(error = %why, "the publish watch keeps failing; idle workers find other processes' publishes by polling");
                } else {
                    tracing::debug!(error = %why, "publish watch failed; the workers poll meanwhile");
                }
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
        let now = look(&self.path, &self.index);
        let inode = now.file;
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, ino)| Some(*ino) != inode)
        {
            tracing::warn!(path = %self.path.display(), "the database file was replaced under its path: this process's connections still use the old one, restart it (the publish watch follows the new one)");
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
        // Each look its own statement, read to the end, so that no read snapshot
        // outlives it.
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
