//! The statement runner of the stores written once in queue-core
//! ([`queue_core::sql::runner`]): schedules.

use async_trait::async_trait;
use queue_core::sql::runner::{Bind, Cell, Kind, SqlRunner};
use queue_core::Result;
use sqlx::{MySqlPool, Row};

use crate::error::SqlxResultExt;

/// Runs statements on the pool.
#[derive(Debug, Clone)]
pub(crate) struct MySqlRunner(pub(crate) MySqlPool);

fn query<'q>(
    sql: &'q str,
    binds: &[Bind<'q>],
) -> sqlx::query::Query<'q, sqlx::MySql, <sqlx::MySql as sqlx::Database>::Arguments<'q>> {
    binds.iter().fold(sqlx::query(sql), |q, b| match *b {
        Bind::Text(t) => q.bind(t),
        Bind::Int(n) => q.bind(n),
    })
}

#[async_trait]
impl SqlRunner for MySqlRunner {
    async fn execute(&self, sql: &str, binds: &[Bind<'_>]) -> Result<u64> {
        let done = query(sql, binds).execute(&self.0).await.backend()?;
        Ok(done.rows_affected())
    }

    async fn fetch(
        &self,
        sql: &str,
        binds: &[Bind<'_>],
        columns: &[Kind],
    ) -> Result<Vec<Vec<Cell>>> {
        let rows = query(sql, binds).fetch_all(&self.0).await.backend()?;
        rows.iter()
            .map(|row| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, kind)| match kind {
                        // `utf8mb4_bin` columns come back as binary.
                        Kind::Text => row
                            .try_get::<Vec<u8>, _>(i)
                            .map(|b| Cell::Text(String::from_utf8_lossy(&b).into_owned())),
                        Kind::Int => row.try_get::<i64, _>(i).map(Cell::Int),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .backend()
            })
            .collect()
    }
}
