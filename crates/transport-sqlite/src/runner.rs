//! The statement runner of the stores written once in queue-core
//! ([`queue_core::sql::runner`]): schedules.

use async_trait::async_trait;
use queue_core::sql::runner::{Bind, Cell, Kind, SqlRunner};
use queue_core::Result;
use sqlx::{Row, SqlitePool};

use crate::error::SqlxResultExt;

/// Runs statements on the pool.
#[derive(Debug, Clone)]
pub(crate) struct SqliteRunner(pub(crate) SqlitePool);

fn query<'q>(
    sql: &'q str,
    binds: &[Bind<'q>],
) -> sqlx::query::Query<'q, sqlx::Sqlite, <sqlx::Sqlite as sqlx::Database>::Arguments<'q>> {
    binds.iter().fold(sqlx::query(sql), |q, b| match *b {
        Bind::Text(t) => q.bind(t),
        Bind::Int(n) => q.bind(n),
    })
}

#[async_trait]
impl SqlRunner for SqliteRunner {
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
                        Kind::Text => row.try_get::<String, _>(i).map(Cell::Text),
                        Kind::Int => row.try_get::<i64, _>(i).map(Cell::Int),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .backend()
            })
            .collect()
    }
}
