use queue_core::sql::{check_existing_version, check_schema_version, missing_store};
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
    (
        3,
        include_str!("../../../migrations/sqlite/0003_status_history.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/sqlite/0004_holders_labels.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/sqlite/0005_ordering_keys.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/sqlite/0006_unique_keys.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/sqlite/0007_limits.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/sqlite/0008_controls.sql"),
    ),
    (
        9,
        include_str!("../../../migrations/sqlite/0009_limit_waits.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/sqlite/0010_schedules.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/sqlite/0011_checkpoints.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/sqlite/0012_job_logs.sql"),
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

/// For an open that must create nothing (read-only tools): checks that the table and the
/// migration ledger exist and that the table is at this build's schema version, and
/// names what is missing otherwise. Only reads `sqlite_master`.
pub(crate) async fn check_existing(pool: &SqlitePool, table: &str) -> Result<()> {
    let exists = |name: &str| {
        let name = name.to_owned();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            )
            .bind(name)
            .fetch_one(pool)
            .await
            .backend()
            .map(|n| n > 0)
        }
    };
    if !exists(table).await? {
        return Err(missing_store(
            "QUEUE_TABLE",
            table,
            "an existing table",
            &format!("the SQLite database has no table \"{table}\""),
        ));
    }
    let newest: Option<i64> = if exists("switchyard_migrations").await? {
        sqlx::query_scalar("SELECT max(version) FROM switchyard_migrations WHERE target = ?1")
            .bind(table)
            .fetch_one(pool)
            .await
            .backend()?
    } else {
        None
    };
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    check_existing_version(table, newest, known)
}
