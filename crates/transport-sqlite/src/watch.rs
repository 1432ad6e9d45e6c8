//! Wake-ups for publishes of other processes on the same file. SQLite tells a connection
//! of nothing another one commits, so once a worker of this transport has asked for a
//! wake-up signal, one task per transport looks every few milliseconds, while a claim of
//! this transport last found nothing (no look while every worker is busy):
//!
//! - at the files' `stat` (the write-ahead log's and the database's size, time and
//!   inode: one system call each, no query), which a commit changes;
//! - after a change, on that look and the next (a commit's frames are written a moment
//!   before it becomes visible), and at least every 100 ms whatever the files say (a
//!   file time may not move between two commits within one clock tick), at
//!   `PRAGMA data_version` on a connection of its own, which changes when another
//!   connection has committed;
//! - when that changed, at the newest row's seq and, when it grew, at which queues the
//!   new rows are on, whose idle workers it wakes.
//!
//! The watch never opens the database's files itself: closing a file descriptor drops
//! every POSIX lock the process holds on that file, its SQLite connections' included,
//! and another process's checkpoint may then overwrite pages they are reading (an
//! earlier watch that read the `-shm` file's header corrupted databases that way). A
//! file replaced under its path (a restore) is seen by its inode: the watch opens the new
//! one and wakes every idle worker, and warns that this process's own connections still
//! use the old file (restart it). The workers' own polling stays the truth: due delays,
//! releases and lapsed leases add no row.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use queue_core::sql::watch_loop::{run_watch, Look};
use queue_core::sql::{lossy, Wakers};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use tokio_util::sync::CancellationToken;

/// The statements of the watch: the newest seq, and the queues of rows in a seq range.
#[derive(Debug, Clone)]
pub(crate) struct WatchSql {
    pub(crate) max_seq: String,
    pub(crate) queues_between: String,
}

/// The longest the watch goes without asking SQLite, whatever the files' `stat` says.
const ASK_AT_LEAST_EVERY: Duration = Duration::from_millis(100);

/// What `stat` says of a file: inode, size and modification time; `None` when missing.
type Stat = Option<(u64, u64, i64, i64)>;

#[cfg(unix)]
fn stat(path: &Path) -> Stat {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

#[cfg(not(unix))]
fn stat(path: &Path) -> Stat {
    let m = std::fs::metadata(path).ok()?;
    let since = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    Some((
        0,
        m.len(),
        since.as_secs() as i64,
        i64::from(since.subsec_nanos()),
    ))
}

/// The watch's state between looks.
struct Watch {
    connect: SqliteConnectOptions,
    path: PathBuf,
    /// The write-ahead log beside it.
    wal: PathBuf,
    sql: WatchSql,
    conn: Option<(SqliteConnection, u64)>,
    /// The newest seq seen; `None` after a (re)connect.
    last: Option<i64>,
    /// `PRAGMA data_version` as last read on `conn`.
    version: Option<i64>,
    /// The files as last looked at, how many more looks ask SQLite whatever they say,
    /// and when it was last asked.
    files: (Stat, Stat),
    ask: u8,
    asked: Instant,
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
    // A symbolic link's target is the file whose inode tells a replacement.
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let watch = Watch {
        connect: connect.create_if_missing(false),
        path,
        wal: PathBuf::from(wal),
        sql,
        conn: None,
        last: None,
        version: None,
        files: (None, None),
        ask: 0,
        asked: Instant::now(),
    };
    run_watch(watch, every, wakers, stop).await;
}

#[async_trait]
impl Look for Watch {
    fn due(&mut self, wakers: &Wakers) -> bool {
        self.due_now(wakers)
    }

    async fn ask(&mut self, wakers: &Wakers) -> Result<(), Box<dyn fmt::Display + Send>> {
        self.read(wakers)
            .await
            .map_err(|e| Box::new(e) as Box<dyn fmt::Display + Send>)
    }

    async fn disconnect(&mut self) {
        if let Some((c, _)) = self.conn.take() {
            let _ = c.close().await;
        }
    }
}

impl Watch {
    /// Whether this look asks SQLite: a worker may be waiting, and the files changed
    /// (or did one look ago), or SQLite was not asked for a while, or there is no
    /// connection, or the file was replaced.
    fn due_now(&mut self, wakers: &Wakers) -> bool {
        // While every claim finds work no worker waits for a wake-up: the reads would be
        // spent on this process's own commits.
        if !wakers.any_idle() {
            return false;
        }
        let files = (stat(&self.path), stat(&self.wal));
        if files != self.files {
            self.files = files;
            self.ask = 2;
        }
        let inode = files.0.map(|f| f.0);
        let replaced = self
            .conn
            .as_ref()
            .is_some_and(|(_, ino)| Some(*ino) != inode);
        self.conn.is_none()
            || replaced
            || self.ask > 0
            || self.asked.elapsed() >= ASK_AT_LEAST_EVERY
    }

    /// Asks SQLite whether another connection committed and, when it did, wakes the
    /// queues of rows newer than the last seen.
    async fn read(&mut self, wakers: &Wakers) -> Result<(), sqlx::Error> {
        self.ask = self.ask.saturating_sub(1);
        self.asked = Instant::now();
        let inode = self.files.0.map(|f| f.0);
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
            self.version = None;
        }
        let Some((c, _)) = self.conn.as_mut() else {
            return Ok(());
        };
        // Each look its own statement, read to the end, so that no read snapshot
        // outlives it.
        let version = first(
            sqlx::query_scalar("PRAGMA data_version")
                .persistent(false)
                .fetch_all(&mut *c)
                .await?,
        );
        if self.last.is_some() && self.version == Some(version) {
            return Ok(());
        }
        let newest = first(
            sqlx::query_scalar(&self.sql.max_seq)
                .persistent(false)
                .fetch_all(&mut *c)
                .await?,
        );
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
        // Read before the seq: a commit between the two reads changes it again.
        self.version = Some(version);
        self.last = Some(newest);
        Ok(())
    }
}

/// The one value of a one-row answer (0 for none).
fn first(values: Vec<i64>) -> i64 {
    values.first().copied().unwrap_or(0)
}
