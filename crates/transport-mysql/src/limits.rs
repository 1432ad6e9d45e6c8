//! Workers' limits kept in this database ([`queue_core::sql::limits`]): for the
//! transport's own jobs, and for RabbitMQ's when this database is its control store.
//! The store is [`queue_core::sql_limits!`]; what differs here is this database's.

use std::sync::Arc;

use queue_core::sql::limits::{Dialect, LimitStatements};
use queue_core::Result;
use sqlx::{MySqlConnection, MySqlPool, Row};

use crate::error::SqlxResultExt;

/// How many times an acquire runs in all when it loses deadlocks.
const DEADLOCK_TRIES: usize = 20;

/// The limit tables of one table of jobs.
#[derive(Debug)]
pub(crate) struct MySqlLimits {
    pool: MySqlPool,
    sql: Arc<LimitStatements>,
    /// The transport's snooze, which parks a job.
    park: String,
}

impl MySqlLimits {
    pub(crate) fn new(pool: MySqlPool, schema: Option<&str>, table: &str) -> Self {
        let sql =
            LimitStatements::new(Dialect::MySql).map(|s| crate::sql::specialise(s, schema, table));
        MySqlLimits {
            pool,
            sql: Arc::new(sql),
            park: crate::sql::specialise(crate::sql::SNOOZE, schema, table),
        }
    }
}

queue_core::sql_limits!(
    MySqlLimits,
    conn: MySqlConnection,
    begin: |pool| pool.begin(),
    text: text,
    park_job: park_job,
    tries: DEADLOCK_TRIES,
);

/// A text column of a binary collation, which the driver hands over as bytes.
fn text(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<Option<String>> {
    let bytes: Option<Vec<u8>> = row.try_get(i).backend()?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Parks the job `id` under the lease `job_token` until `backstop_us` at the latest.
async fn park_job(
    conn: &mut MySqlConnection,
    sql: &str,
    id: &str,
    job_token: &str,
    backstop_us: i64,
) -> Result<bool> {
    let done = sqlx::query(sql)
        .bind(backstop_us)
        .bind(backstop_us)
        .bind(backstop_us)
        .bind(id)
        .bind(job_token)
        .execute(conn)
        .await
        .backend()?;
    Ok(done.rows_affected() == 1)
}
