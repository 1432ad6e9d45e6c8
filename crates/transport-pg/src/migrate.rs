use queue_core::sql::check_schema_version;
use queue_core::Result;
use sqlx::{Executor, PgPool};

use crate::error::SqlxResultExt;
use crate::sql::specialise;

/// The schema versions, in order. Each is plain SQL for the default table name.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_hot_claims.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_status.sql"),
    ),
];

/// Applies the migrations that `schema.table` lacks. Safe to run from many processes at
/// once: a transaction-scoped advisory lock serialises migrators (concurrent
/// `CREATE … IF NOT EXISTS` can otherwise fail on the catalog's unique indexes), and each
/// version is recorded in the same commit that applies it.
pub(crate) async fn migrate(pool: &PgPool, schema: Option<&str>, table: &str) -> Result<()> {
    let ledger = match schema {
        Some(s) => format!("\"{s}\".switchyard_migrations"),
        None => "switchyard_migrations".to_owned(),
    };
    let mut tx = pool.begin().await.backend()?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('switchyard migrations'))")
        .execute(&mut *tx)
        .await
        .backend()?;
    if let Some(schema) = schema {
        tx.execute(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str())
            .await
            .backend()?;
    }
    tx.execute(
        format!(
            "CREATE TABLE IF NOT EXISTS {ledger} (
                target     text        NOT NULL,
                version    integer     NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (target, version))"
        )
        .as_str(),
    )
    .await
    .backend()?;
    for (version, script) in MIGRATIONS {
        let applied: Option<i32> = sqlx::query_scalar(&format!(
            "SELECT version FROM {ledger} WHERE target = $1 AND version = $2"
        ))
        .bind(table)
        .bind(version)
        .fetch_optional(&mut *tx)
        .await
        .backend()?;
        if applied.is_some() {
            continue;
        }
        // A string without parameters goes over the simple protocol, which runs every
        // statement of the script.
        tx.execute(specialise(script, schema, table).as_str())
            .await
            .backend()?;
        sqlx::query(&format!(
            "INSERT INTO {ledger} (target, version) VALUES ($1, $2)"
        ))
        .bind(table)
        .bind(version)
        .execute(&mut *tx)
        .await
        .backend()?;
        tracing::info!(schema, table, version, "applied postgres migration");
    }
    let newest: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM {ledger} WHERE target = $1"
    ))
    .bind(table)
    .fetch_one(&mut *tx)
    .await
    .backend()?;
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    check_schema_version(table, newest.map(i64::from), i64::from(known))?;
    tx.commit().await.backend()
}

/// Drops `schema.table` and its dead-letter table, and forgets their migrations.
pub(crate) async fn uninstall(pool: &PgPool, schema: Option<&str>, table: &str) -> Result<()> {
    let ledger = match schema {
        Some(s) => format!("\"{s}\".switchyard_migrations"),
        None => "switchyard_migrations".to_owned(),
    };
    let mut tx = pool.begin().await.backend()?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('switchyard migrations'))")
        .execute(&mut *tx)
        .await
        .backend()?;
    tx.execute(
        specialise(
            "DROP TABLE IF EXISTS \"switchyard_jobs\", \"switchyard_jobs_dead\", \"switchyard_jobs_status\"",
            schema,
            table,
        )
        .as_str(),
    )
    .await
    .backend()?;
    sqlx::query(&format!("DELETE FROM {ledger} WHERE target = $1"))
        .bind(table)
        .execute(&mut *tx)
        .await
        .backend()?;
    tx.commit().await.backend()
}
