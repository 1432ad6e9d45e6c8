//! Workers' limits kept in this database ([`queue_core::sql::limits`]): for the
//! transport's own jobs, and for RabbitMQ's when this database is its control store.
//! The store is [`queue_core::sql_limits!`]; what differs here is this database's.

use std::sync::Arc;

use queue_core::sql::limits::{Dialect, LimitStatements};
use queue_core::Result;
use sqlx::{Row, SqliteConnection, SqlitePool};

use crate::error::SqlxResultExt;

/// How many times an acquire runs in all when it fails transiently (the write lock
/// was busy past the busy timeout).
const DEADLOCK_TRIES: usize = 20;

/// The limit tables of one table of jobs.
#[derive(Debug)]
pub(crate) struct SqliteLimits {
    pool: SqlitePool,
    sql: Arc<LimitStatements>,
    /// The transport's snooze, which parks a job.
    park: String,
}

impl SqliteLimits {
    pub(crate) fn new(pool: SqlitePool, table: &str) -> Self {
        let sql = LimitStatements::new(Dialect::Sqlite).map(|s| crate::sql::specialise(s, table));
        SqliteLimits {
            pool,
            sql: Arc::new(sql),
            park: crate::sql::specialise(crate::sql::SNOOZE, table),
        }
    }
}

queue_core::sql_limits!(
    SqliteLimits,
    conn: SqliteConnection,
    begin: |pool| pool.begin_with("BEGIN IMMEDIATE"),
    text: text,
    park_job: park_job,
    tries: DEADLOCK_TRIES,
);

/// A text column.
fn text(row: &sqlx::sqlite::SqliteRow, i: usize) -> Result<Option<String>> {
    row.try_get(i).backend()
}

/// Parks the job `id` under the lease `job_token` until `backstop_us` at the latest.
async fn park_job(
    conn: &mut SqliteConnection,
    sql: &str,
    id: &str,
    job_token: &str,
    backstop_us: i64,
) -> Result<bool> {
    let done = sqlx::query(sql)
        .bind(backstop_us)
        .bind(id)
        .bind(job_token)
        .execute(conn)
        .await
        .backend()?;
    Ok(done.rows_affected() == 1)
}
