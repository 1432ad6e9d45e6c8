//! The bare baseline on SQLite: the transport's file, WAL mode and `FULL` syncs, one
//! connection (one writer at a time), and a claim of 100 rows in one `UPDATE …
//! RETURNING`, as SQLite has no `SKIP LOCKED`.

use std::str::FromStr;
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Sqlite;
use switchyard::Result;

use super::table::{drain, Table, BATCH};
use super::{err, Rest};

impl Table<Sqlite> {
    pub(super) async fn open_sqlite(url: &str, name: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(30));
        // One writer: more connections would only wait on SQLite's write lock.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(err)?;
        let table = format!("\"{name}\"");
        let create = [
            format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, queue TEXT NOT NULL, \
                 payload TEXT NOT NULL, \
                 run_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)), \
                 claimed_at INTEGER)"
            ),
            format!("CREATE INDEX \"{name}_claim\" ON {table} (queue, run_at, id)"),
        ];
        Table { pool, table }.created(&create).await
    }

    /// Drains the `rows` rows of `queue`.
    pub(super) async fn measure_sqlite(
        &self,
        queue: &str,
        rows: usize,
        concurrency: usize,
    ) -> Result<Rest> {
        let (pool, table) = (&self.pool, &self.table);
        let claim = Arc::new(format!(
            "UPDATE {table} SET claimed_at = CAST(unixepoch('subsec') * 1000000 AS INTEGER) WHERE id IN \
             (SELECT id FROM {table} WHERE queue = ? AND claimed_at IS NULL \
              ORDER BY run_at, id LIMIT {BATCH}) RETURNING id"
        ));
        let delete = Arc::new(format!(
            "DELETE FROM {table} WHERE id IN (SELECT value FROM json_each(?))"
        ));
        let queue: Arc<str> = Arc::from(queue);
        let drain_per_s = drain(concurrency, rows, {
            let pool = pool.clone();
            move || {
                let (pool, claim, delete) = (pool.clone(), claim.clone(), delete.clone());
                let queue = queue.clone();
                async move {
                    let ids: Vec<i64> = sqlx::query_scalar(&claim)
                        .bind(&*queue)
                        .fetch_all(&pool)
                        .await
                        .map_err(err)?;
                    if !ids.is_empty() {
                        let list = serde_json::to_string(&ids).map_err(err)?;
                        sqlx::query(&delete)
                            .bind(list)
                            .execute(&pool)
                            .await
                            .map_err(err)?;
                    }
                    Ok(ids.len())
                }
            }
        })
        .await?;
        Ok(Rest {
            drain_per_s,
            pickup: None,
        })
    }
}
