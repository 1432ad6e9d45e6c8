//! The consumer inbox on SQLite (see [`queue_core::inbox`]).

use std::time::Duration;

use queue_core::inbox::DEFAULT_TABLE;
use queue_core::status::{prune_in_slices, PRUNE_SLICE};
use queue_core::{Identifier, Result};
use sqlx::{Sqlite, SqlitePool};
use uuid::Uuid;

use crate::error::SqlxResultExt;
use crate::sql::NOW;

/// Message ids a consumer has handled, in the application's SQLite database.
///
/// Begin the handler's transaction with `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN
/// IMMEDIATE")`) when other processes write to the same file: a deferred transaction
/// that reads first and then writes may fail with `SQLITE_BUSY` instead of waiting.
///
/// ```no_run
/// # async fn f(pool: sqlx::SqlitePool, id: uuid::Uuid) -> queue_core::Result<()> {
/// let backend = |e| queue_core::Error::backend("sqlite", false, e);
/// let inbox = transport_sqlite::SqliteInbox::open(pool.clone(), None).await?;
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(backend)?;
/// if inbox.claim(&mut tx, id).await? {
///     // … the handler's work on `tx` …
/// }
/// tx.commit().await.map_err(backend)?;
/// // … then ack the message …
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteInbox {
    pool: SqlitePool,
    claim: String,
    prune: String,
}

impl SqliteInbox {
    /// Opens the inbox table `table` (default `switchyard_inbox`) of the database of
    /// `pool`, creating it when missing.
    pub async fn open(pool: SqlitePool, table: Option<&str>) -> Result<Self> {
        let table = Identifier::new("inbox table", table.unwrap_or(DEFAULT_TABLE))?;
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS \"{table}\" (\
                 id TEXT PRIMARY KEY NOT NULL, \
                 seen_at INTEGER NOT NULL) WITHOUT ROWID"
        ))
        .execute(&mut *tx)
        .await
        .backend()?;
        sqlx::query(&format!(
            "CREATE INDEX IF NOT EXISTS \"{table}_seen\" ON \"{table}\" (seen_at)"
        ))
        .execute(&mut *tx)
        .await
        .backend()?;
        tx.commit().await.backend()?;
        Ok(SqliteInbox {
            pool,
            claim: format!(
                "INSERT INTO \"{table}\" (id, seen_at) VALUES (?, {NOW}) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            prune: format!(
                "DELETE FROM \"{table}\" WHERE id IN (SELECT id FROM \"{table}\" \
                 WHERE seen_at < {NOW} - ? LIMIT {PRUNE_SLICE})"
            ),
        })
    }

    /// Records `id` inside the handler's transaction: `true` the first time (do the
    /// work on `tx`), `false` when a committed transaction already claimed it (skip the
    /// work, then ack).
    pub async fn claim(&self, tx: &mut sqlx::Transaction<'_, Sqlite>, id: Uuid) -> Result<bool> {
        let inserted = sqlx::query(&self.claim)
            .bind(id.to_string())
            .execute(&mut **tx)
            .await
            .backend()?
            .rows_affected();
        Ok(inserted == 1)
    }

    /// Deletes the ids claimed longer ago than `older_than` (in slices, so that no
    /// statement holds the write lock for long), returning how many. Keep ids for longer
    /// than a message can be redelivered.
    pub async fn prune(&self, older_than: Duration) -> Result<u64> {
        let age = queue_core::sql::micros(older_than);
        prune_in_slices(|| async {
            Ok(sqlx::query(&self.prune)
                .bind(age)
                .execute(&self.pool)
                .await
                .backend()?
                .rows_affected())
        })
        .await
    }
}
