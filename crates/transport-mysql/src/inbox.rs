//! The consumer inbox on MySQL and MariaDB (see [`queue_core::inbox`]).

use std::time::Duration;

use queue_core::inbox::DEFAULT_TABLE;
use queue_core::status::{prune_in_slices, PRUNE_SLICE};
use queue_core::{Identifier, Result};
use sqlx::{MySql, MySqlPool};
use uuid::Uuid;

use crate::error::SqlxResultExt;

/// Message ids a consumer has handled, in the application's MySQL or MariaDB database.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, id: uuid::Uuid) -> queue_core::Result<()> {
/// let backend = |e| queue_core::Error::backend("mysql", false, e);
/// let inbox = transport_mysql::MySqlInbox::open(pool.clone(), None, None).await?;
/// let mut tx = pool.begin().await.map_err(backend)?;
/// if inbox.claim(&mut tx, id).await? {
///     // … the handler's work on `tx` …
/// }
/// tx.commit().await.map_err(backend)?;
/// // … then ack the message …
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlInbox {
    pool: MySqlPool,
    claim: String,
    prune: String,
}

impl MySqlInbox {
    /// Opens the inbox table `table` (default `switchyard_inbox`) in `database` (default:
    /// the connection's), creating the database and table when missing.
    pub async fn open(
        pool: MySqlPool,
        database: Option<&str>,
        table: Option<&str>,
    ) -> Result<Self> {
        let table = Identifier::new("inbox table", table.unwrap_or(DEFAULT_TABLE))?;
        let database = database
            .map(|d| Identifier::new("inbox database", d))
            .transpose()?;
        let name = match &database {
            Some(database) => format!("`{database}`.`{table}`"),
            None => format!("`{table}`"),
        };
        if let Some(database) = &database {
            sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS `{database}`"))
                .execute(&pool)
                .await
                .backend()?;
        }
        // Ids are text as the queue tables keep them; ascii keeps the key at 36 bytes.
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {name} (\
                 id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
                 seen_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                 KEY seen (seen_at)) ENGINE=InnoDB"
        ))
        .execute(&pool)
        .await
        .backend()?;
        Ok(MySqlInbox {
            pool,
            // IGNORE turns only the duplicate key into "0 rows": the id is always 36
            // ASCII characters, so no other error it would hide can occur.
            claim: format!("INSERT IGNORE INTO {name} (id) VALUES (?)"),
            prune: format!(
                "DELETE FROM {name} WHERE seen_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT {PRUNE_SLICE}"
            ),
        })
    }

    /// Records `id` inside the handler's transaction: `true` the first time (do the
    /// work on `tx`), `false` when a committed transaction already claimed it (skip the
    /// work, then ack). A claim of the same id in a transaction still open waits for
    /// that transaction's end.
    pub async fn claim(&self, tx: &mut sqlx::Transaction<'_, MySql>, id: Uuid) -> Result<bool> {
        let inserted = sqlx::query(&self.claim)
            .bind(id.to_string())
            .execute(&mut **tx)
            .await
            .backend()?
            .rows_affected();
        Ok(inserted == 1)
    }

    /// Deletes the ids claimed longer ago than `older_than` (in slices, so that no
    /// statement holds locks for long), returning how many. Keep ids for longer than a
    /// message can be redelivered.
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
