use queue_core::sql::check_schema_version;
use queue_core::Result;
use sqlx::{Executor, SqlitePool};

use crate::error::SqlxResultExt;
use crate::sql::specialise;

/// The schema versions, in order. Each is plain SQL for the default table name.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../../migrations/sqlite/0001_init.sql")),
    (
        2,
        include_str!("../../../migrations/sqlite/0002_status.sql"),
    ),
];

const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS switchyard_migrations (
    target     TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (target, version))";

/// Applies the migrations `table` lacks. Safe to run from several processes at once:
/// each version is applied under SQLite's write lock and recorded in the same commit.
pub(crate) async fn migrate(pool: &SqlitePool, table: &str) -> Result<()> {
    pool.execute(CREATE_LEDGER).await.backend()?;
    for (version, script) in MIGRATIONS {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.backend()?;
        let applied: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM switchyard_migrations WHERE target = ?1 AND version = ?2",
        )
        .bind(table)
        .bind(version)
        .fetch_optional(&mut *tx)
        .await
        .backend()?;
        if applied.is_some() {
            continue;
        }
        // A plain string runs every statement of the script (`raw_sql` would too, but its
        // future is not provably `Send` inside `async_trait` callers).
        tx.execute(specialise(script, table).as_str())
            .await
            .backend()?;
        sqlx::query(&specialise(
            "INSERT INTO switchyard_migrations (target, version, applied_at) VALUES (?1, ?2, {NOW})",
            "switchyard_jobs",
        ))
        .bind(table)
        .bind(version)
        .execute(&mut *tx)
        .await
        .backend()?;
        tx.commit().await.backend()?;
        tracing::info!(table, version, "applied sqlite migration");
    }
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM switchyard_migrations WHERE target = ?1")
            .bind(table)
            .fetch_one(pool)
            .await
            .backend()?;
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    check_schema_version(table, newest, known)
}
