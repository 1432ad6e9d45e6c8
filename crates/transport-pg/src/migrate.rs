use queue_core::sql::{
    check_existing_version, check_schema_version, created_tables, missing_store,
};
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
    (
        4,
        include_str!("../../../migrations/postgres/0004_status_history.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_holders_labels.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/postgres/0006_ordering_keys.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/postgres/0007_unique_keys.sql"),
    ),
    (
        8,
        include_str!("../../../migrations/postgres/0008_limits.sql"),
    ),
    (
        9,
        include_str!("../../../migrations/postgres/0009_controls.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/postgres/0010_limit_waits.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/postgres/0011_schedules.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/postgres/0012_checkpoints.sql"),
    ),
    (
        13,
        include_str!("../../../migrations/postgres/0013_job_logs.sql"),
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

/// For an open that must create nothing (read-only tools): checks that the schema, the
/// table and the migration ledger exist and that the table is at this build's schema
/// version, and names what is missing otherwise. Only reads the catalog.
pub(crate) async fn check_existing(pool: &PgPool, schema: Option<&str>, table: &str) -> Result<()> {
    let place = match schema {
        Some(s) => {
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(s)
                    .fetch_one(pool)
                    .await
                    .backend()?;
            if !exists {
                return Err(missing_store(
                    "QUEUE_SCHEMA",
                    s,
                    "an existing schema",
                    &format!("the PostgreSQL database has no schema \"{s}\""),
                ));
            }
            format!("PostgreSQL schema \"{s}\"")
        }
        None => {
            let current: Option<String> = sqlx::query_scalar("SELECT current_schema()")
                .fetch_one(pool)
                .await
                .backend()?;
            match current {
                Some(c) => format!("PostgreSQL schema \"{c}\" (the search_path's first)"),
                None => "the PostgreSQL search_path (none of its schemas exists)".to_owned(),
            }
        }
    };
    // Names are validated identifiers, so quoting them is all `to_regclass` needs; it
    // resolves an unqualified name through the search_path, as the statements do.
    let regclass = |name: &str| match schema {
        Some(s) => format!("\"{s}\".\"{name}\""),
        None => format!("\"{name}\""),
    };
    let exists = |name: String| async move {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
            .bind(name)
            .fetch_one(pool)
            .await
            .backend()
    };
    if !exists(regclass(table)).await? {
        return Err(missing_store(
            "QUEUE_TABLE",
            table,
            "an existing table",
            &format!("{place} has no table \"{table}\""),
        ));
    }
    let newest: Option<i32> = if exists(regclass("switchyard_migrations")).await? {
        sqlx::query_scalar(&format!(
            "SELECT max(version) FROM {} WHERE target = $1",
            regclass("switchyard_migrations")
        ))
        .bind(table)
        .fetch_one(pool)
        .await
        .backend()?
    } else {
        None
    };
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    check_existing_version(table, newest.map(i64::from), i64::from(known))
}

/// Drops `schema.table` and every table its migrations created beside it, and forgets
/// their migrations.
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
    let tables = created_tables(MIGRATIONS.iter().map(|(_, script)| *script)).join(", ");
    tx.execute(specialise(&format!("DROP TABLE IF EXISTS {tables}"), schema, table).as_str())
        .await
        .backend()?;
    sqlx::query(&format!("DELETE FROM {ledger} WHERE target = $1"))
        .bind(table)
        .execute(&mut *tx)
        .await
        .backend()?;
    tx.commit().await.backend()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_store_names_every_table_the_scripts_create() {
        let scripts = || MIGRATIONS.iter().map(|(_, script)| *script);
        let created: usize = scripts().map(|s| s.matches("CREATE TABLE").count()).sum();
        assert_eq!(created_tables(scripts()).len(), created);
    }
}
