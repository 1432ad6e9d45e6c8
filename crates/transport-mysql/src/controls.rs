//! An operator's controls kept in this database ([`queue_core::sql::controls`]): paused
//! queues and cancellation marks, for the transport's own jobs and for RabbitMQ's when
//! this database is its control store.

use async_trait::async_trait;
use queue_core::sql::controls::ControlStatements;
use queue_core::sql::limits::Dialect;
use queue_core::{Controls, Paused, Result};
use sqlx::{MySqlPool, Row};
use uuid::Uuid;

use crate::error::SqlxResultExt;

/// The control tables of one table of jobs.
#[derive(Debug)]
pub(crate) struct MySqlControls {
    pool: MySqlPool,
    sql: ControlStatements,
}

impl MySqlControls {
    pub(crate) fn new(pool: MySqlPool, schema: Option<&str>, table: &str) -> Self {
        let sql = ControlStatements::new(Dialect::MySql)
            .map(|s| crate::sql::specialise(s, schema, table));
        MySqlControls { pool, sql }
    }
}

#[async_trait]
impl Controls for MySqlControls {
    async fn pause(&self, queue: &str, kind: Option<&str>) -> Result<()> {
        sqlx::query(&self.sql.pause)
            .bind(queue)
            .bind(kind.unwrap_or_default())
            .execute(&self.pool)
            .await
            .backend()
            .map(|_| ())
    }

    async fn resume(&self, queue: &str, kind: Option<&str>) -> Result<bool> {
        let done = sqlx::query(&self.sql.resume)
            .bind(queue)
            .bind(kind.unwrap_or_default())
            .execute(&self.pool)
            .await
            .backend()?;
        Ok(done.rows_affected() > 0)
    }

    async fn paused(&self) -> Result<Vec<Paused>> {
        let rows = sqlx::query(&self.sql.paused)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        rows.iter()
            .map(|r| {
                let kind = text(r, 1)?;
                Ok(Paused {
                    queue: text(r, 0)?,
                    kind: (!kind.is_empty()).then_some(kind),
                })
            })
            .collect()
    }

    async fn cancel(&self, ids: &[Uuid]) -> Result<()> {
        for id in ids {
            sqlx::query(&self.sql.cancel)
                .bind(id.to_string())
                .execute(&self.pool)
                .await
                .backend()?;
        }
        Ok(())
    }

    async fn cancelled(&self) -> Result<Vec<Uuid>> {
        let rows = sqlx::query(&self.sql.cancelled)
            .fetch_all(&self.pool)
            .await
            .backend()?;
        // A mark that is not a job id marks nothing a worker could meet.
        Ok(rows
            .iter()
            .filter_map(|r| text(r, 0).ok())
            .filter_map(|id| Uuid::parse_str(&id).ok())
            .collect())
    }

    async fn marks(&self) -> Result<(u64, i64)> {
        let row = sqlx::query(&self.sql.marks)
            .fetch_one(&self.pool)
            .await
            .backend()?;
        let count: i64 = row.try_get(0).backend()?;
        let newest: i64 = row.try_get(1).backend()?;
        Ok((u64::try_from(count).unwrap_or(0), newest))
    }

    async fn forget(&self, ids: &[Uuid]) -> Result<()> {
        for id in ids {
            sqlx::query(&self.sql.forget)
                .bind(id.to_string())
                .execute(&self.pool)
                .await
                .backend()?;
        }
        Ok(())
    }
}

/// A text column of a binary collation, which the driver hands over as bytes.
fn text(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<String> {
    let bytes: Vec<u8> = row.try_get(i).backend()?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
