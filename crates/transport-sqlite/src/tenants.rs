//! Finding tenants: SQLite files that hold a store.

use std::path::Path;

use queue_core::Result;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::Connection;

use crate::error::SqlxResultExt;

/// Whether the SQLite file at `path` holds a table named `table`: a file that fits a
/// tenant pattern but is not a store (another application's database, say) is not a
/// tenant. Opens the file read-only and changes nothing.
pub async fn holds_table(path: &Path, table: &str) -> Result<bool> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .backend()?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(table)
            .fetch_optional(&mut conn)
            .await
            .backend()?;
    conn.close().await.ok();
    Ok(found.is_some())
}
