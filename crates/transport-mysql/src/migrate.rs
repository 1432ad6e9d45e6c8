use queue_core::sql::{
    check_existing_version, check_schema_version, created_tables, missing_store,
};
use queue_core::Result;
use sqlx::{Executor, MySqlPool};

use crate::error::SqlxResultExt;
use crate::sql::specialise;

/// The schema versions, in order. Each is plain SQL for the default table name.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../../migrations/mysql/0001_init.sql")),
    (
        2,
        include_str!("../../../migrations/mysql/0002_dead_tombstones.sql"),
    ),
    (3, include_str!("../../../migrations/mysql/0003_status.sql")),
    (
        4,
        include_str!("../../../migrations/mysql/0004_status_history.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/mysql/0005_holders_labels.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/mysql/0006_ordering_keys.sql"),
    ),
    (
        7,
        include_str!("../../../migrations/mysql/0007_unique_keys.sql"),
    ),
    (8, include_str!("../../../migrations/mysql/0008_limits.sql")),
    (
        9,
        include_str!("../../../migrations/mysql/0009_controls.sql"),
    ),
    (
        10,
        include_str!("../../../migrations/mysql/0010_limit_waits.sql"),
    ),
    (
        11,
        include_str!("../../../migrations/mysql/0011_schedules.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/mysql/0012_checkpoints.sql"),
    ),
    (
        13,
        include_str!("../../../migrations/mysql/0013_job_logs.sql"),
    ),
];

/// The statements of a script: split at `;` ending a line (the scripts put no `;` inside
/// strings or comments), without comment-only chunks.
fn statements(script: &str) -> impl Iterator<Item = String> + '_ {
    script.split(";\n").filter_map(|chunk| {
        let sql: Vec<&str> = chunk
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect();
        let sql = sql.join("\n");
        (!sql.trim().is_empty()).then_some(sql)
    })
}

/// Applies the migrations that `schema.table` lacks. MySQL commits DDL at once, so
/// migrators are serialised with a named lock (`GET_LOCK`) held on one connection, and
/// every statement is idempotent (`IF NOT EXISTS`) should a migrator die half way.
pub(crate) async fn migrate(pool: &MySqlPool, schema: Option<&str>, table: &str) -> Result<()> {
    let ledger = match schema {
        Some(s) => format!("`{s}`.switchyard_migrations"),
        None => "switchyard_migrations".to_owned(),
    };
    let mut conn = pool.acquire().await.backend()?;
    let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK('switchyard migrations', 60)")
        .fetch_one(&mut *conn)
        .await
        .backend()?;
    if locked != Some(1) {
        return Err(queue_core::Error::backend(
            crate::error::TRANSPORT,
            true,
            "another process held the migration lock for 60 s",
        ));
    }
    let outcome = async {
        if let Some(schema) = schema {
            conn.execute(
                format!(
                    "CREATE DATABASE IF NOT EXISTS `{schema}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
                .as_str(),
            )
            .await
            .backend()?;
        }
        conn.execute(
            format!(
                "CREATE TABLE IF NOT EXISTS {ledger} (
                    target     VARCHAR(64) NOT NULL,
                    version    INT         NOT NULL,
                    applied_at BIGINT      NOT NULL,
                    PRIMARY KEY (target, version)) ENGINE = InnoDB"
            )
            .as_str(),
        )
        .await
        .backend()?;
        for (version, script) in MIGRATIONS {
            let applied: Option<i32> = sqlx::query_scalar(&format!(
                "SELECT version FROM {ledger} WHERE target = ? AND version = ?"
            ))
            .bind(table)
            .bind(version)
            .fetch_optional(&mut *conn)
            .await
            .backend()?;
            if applied.is_some() {
                continue;
            }
            for statement in statements(script) {
                conn.execute(specialise(&statement, schema, table).as_str())
                    .await
                    .backend()?;
            }
            sqlx::query(&format!(
                "INSERT INTO {ledger} (target, version, applied_at) \
                 VALUES (?, ?, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED))"
            ))
            .bind(table)
            .bind(version)
            .execute(&mut *conn)
            .await
            .backend()?;
            tracing::info!(schema, table, version, "applied mysql migration");
        }
        let newest: Option<i32> = sqlx::query_scalar(&format!(
            "SELECT MAX(version) FROM {ledger} WHERE target = ?"
        ))
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .backend()?;
        let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
        check_schema_version(table, newest.map(i64::from), i64::from(known))
    }
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK('switchyard migrations')")
        .execute(&mut *conn)
        .await;
    outcome
}

/// For an open that must create nothing (read-only tools): checks that the database
/// (`QUEUE_SCHEMA`, or the URL's), the table and the migration ledger exist and that the
/// table is at this build's schema version, and names what is missing otherwise. Only
/// reads `information_schema`.
pub(crate) async fn check_existing(
    pool: &MySqlPool,
    schema: Option<&str>,
    table: &str,
) -> Result<()> {
    let database = match schema {
        Some(s) => {
            let found: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            )
            .bind(s)
            .fetch_one(pool)
            .await
            .backend()?;
            if found == 0 {
                return Err(missing_store(
                    "QUEUE_SCHEMA",
                    s,
                    "an existing database",
                    &format!(
                        "the MySQL server has no database `{s}` (on MySQL, QUEUE_SCHEMA names a database)"
                    ),
                ));
            }
            s.to_owned()
        }
        None => {
            let current: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
                .fetch_one(pool)
                .await
                .backend()?;
            match current {
                Some(db) => db,
                None => {
                    return Err(missing_store(
                        "QUEUE_TABLE",
                        table,
                        "a table in a selected database",
                        "DATABASE_URL names no database and QUEUE_SCHEMA is unset",
                    ))
                }
            }
        }
    };
    let exists = |name: String| {
        let database = database.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            )
            .bind(database)
            .bind(name)
            .fetch_one(pool)
            .await
            .backend()
            .map(|n| n > 0)
        }
    };
    if !exists(table.to_owned()).await? {
        return Err(missing_store(
            "QUEUE_TABLE",
            table,
            "an existing table",
            &format!("MySQL database `{database}` has no table `{table}`"),
        ));
    }
    let newest: Option<i32> = if exists("switchyard_migrations".to_owned()).await? {
        sqlx::query_scalar(&format!(
            "SELECT MAX(version) FROM `{database}`.switchyard_migrations WHERE target = ?"
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
pub(crate) async fn uninstall(pool: &MySqlPool, schema: Option<&str>, table: &str) -> Result<()> {
    let ledger = match schema {
        Some(s) => format!("`{s}`.switchyard_migrations"),
        None => "switchyard_migrations".to_owned(),
    };
    let tables = created_tables(MIGRATIONS.iter().map(|(_, script)| *script)).join(", ");
    pool.execute(specialise(&format!("DROP TABLE IF EXISTS {tables}"), schema, table).as_str())
        .await
        .backend()?;
    sqlx::query(&format!("DELETE FROM {ledger} WHERE target = ?"))
        .bind(table)
        .execute(pool)
        .await
        .backend()?;
    Ok(())
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

    #[test]
    fn the_script_splits_into_its_statements() {
        let all: Vec<String> = statements(MIGRATIONS[0].1).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all.iter().all(|s| s.contains("CREATE TABLE IF NOT EXISTS")));
    }
}
