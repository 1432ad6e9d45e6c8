//! Workers' limits kept in this database ([`queue_core::sql::limits`]): for the
//! transport's own jobs, and for RabbitMQ's when this database is its control store.
//! The store is [`queue_core::sql_limits!`]; what differs here is this database's.

use std::sync::Arc;

use queue_core::sql::limits::{Dialect, LimitStatements};
use queue_core::Result;
use sqlx::{PgConnection, PgPool, Row};

use crate::error::SqlxResultExt;

/// How many times an acquire runs in all when it loses deadlocks.
const DEADLOCK_TRIES: usize = 20;

/// The limit tables of one table of jobs.
#[derive(Debug)]
pub(crate) struct PgLimits {
    pool: PgPool,
    sql: Arc<LimitStatements>,
    /// The transport's snooze, which parks a job.
    park: String,
}

impl PgLimits {
    pub(crate) fn new(pool: PgPool, schema: Option<&str>, table: &str) -> Self {
        let sql = LimitStatements::new(Dialect::Postgres)
            .map(|s| crate::sql::specialise(s, schema, table));
        PgLimits {
            pool,
            sql: Arc::new(sql),
            park: crate::sql::specialise(crate::sql::SNOOZE, schema, table),
        }
    }
}

queue_core::sql_limits!(
    PgLimits,
    conn: PgConnection,
    begin: |pool| pool.begin(),
    text: text,
    park_job: park_job,
    tries: DEADLOCK_TRIES,
);

/// A text column.
fn text(row: &sqlx::postgres::PgRow, i: usize) -> Result<Option<String>> {
    row.try_get(i).backend()
}

/// Parks the job `id` under the lease `job_token` until `backstop_us` at the latest.
async fn park_job(
    conn: &mut PgConnection,
    sql: &str,
    id: &str,
    job_token: &str,
    backstop_us: i64,
) -> Result<bool> {
    // A token this store's transport wrote is a UUID; anything else is not here.
    let Ok(token) = uuid::Uuid::parse_str(job_token) else {
        return Ok(false);
    };
    let done = sqlx::query(sql)
        .bind(backstop_us)
        .bind(id)
        .bind(token)
        .execute(conn)
        .await
        .backend()?;
    Ok(done.rows_affected() == 1)
}
