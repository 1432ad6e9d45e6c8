//! The consumer inbox on PostgreSQL (see [`queue_core::inbox`]).

use std::time::Duration;

use queue_core::inbox::DEFAULT_TABLE;
use queue_core::status::{prune_in_slices, PRUNE_SLICE};
use queue_core::{Identifier, Result};
use sqlx::{PgPool, Postgres};
use uuid::Uuid;

use crate::error::SqlxResultExt;

/// Message ids a consumer has handled, in the application's PostgreSQL database.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, id: uuid::Uuid) -> queue_core::Result<()> {
/// let backend = |e| queue_core::Error::backend("postgres", false, e);
/// let inbox = transport_pg::PgInbox::open(pool.clone(), None, None).await?;
/// let mut tx = pool.begin().await.map_err(backend)?;
/// if inbox.claim(&mut tx, id).await? {
///     // … the handler's work on `tx` …
/// }
/// tx.commit().await.map_err(backend)?;
/// // … then ack the message …
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
    claim: String,
    prune: String,
}

impl PgInbox {
    /// Opens the inbox table `table` (default `switchyard_inbox`) in `schema` (default:
    /// the connection's `search_path`), creating the schema and table when missing.
    pub async fn open(pool: PgPool, schema: Option<&str>, table: Option<&str>) -> Result<Self> {
        let table = Identifier::new("inbox table", table.unwrap_or(DEFAULT_TABLE))?;
        let schema = schema
            .map(|s| Identifier::new("inbox schema", s))
            .transpose()?;
        let name = match &schema {
            Some(schema) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{table}\""),
        };
        // Processes that open the same inbox at once would race in CREATE … IF NOT
        // EXISTS (a unique violation in the catalog): a lock on the name serialises them.
        let mut tx = pool.begin().await.backend()?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(&name)
            .execute(&mut *tx)
            .await
            .backend()?;
        if let Some(schema) = &schema {
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .execute(&mut *tx)
                .await
                .backend()?;
        }
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {name} (\
                 id uuid PRIMARY KEY, \
                 seen_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ))
        .execute(&mut *tx)
        .await
        .backend()?;
        sqlx::query(&format!(
            "CREATE INDEX IF NOT EXISTS \"{table}_seen\" ON {name} (seen_at)"
        ))
        .execute(&mut *tx)
        .await
        .backend()?;
        tx.commit().await.backend()?;
        Ok(PgInbox {
            pool,
            claim: format!("INSERT INTO {name} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING"),
            prune: format!(
                "DELETE FROM {name} WHERE id IN (SELECT id FROM {name} \
                 WHERE seen_at < clock_timestamp() - $1 * interval '1 microsecond' LIMIT {PRUNE_SLICE})"
            ),
        })
    }

    /// Records `id` inside the handler's transaction: `true` the first time (do the
    /// work on `tx`), `false` when a committed transaction already claimed it (skip the
    /// work, then ack). A claim of the same id in a transaction still open waits for
    /// that transaction's end.
    pub async fn claim(&self, tx: &mut sqlx::Transaction<'_, Postgres>, id: Uuid) -> Result<bool> {
        let inserted = sqlx::query(&self.claim)
            .bind(id)
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
