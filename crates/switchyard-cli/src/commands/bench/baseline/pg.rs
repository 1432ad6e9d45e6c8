//! The bare baseline on PostgreSQL: the payload as `jsonb`, batches inserted from one
//! `text[]` parameter.

use std::sync::Arc;

use sqlx::postgres::PgPoolOptions;
use sqlx::Postgres;
use switchyard::Result;

use super::table::{drain, Table, BATCH};
use super::{err, Rest};

impl Table<Postgres> {
    pub(super) async fn open_pg(url: &str, table: String, concurrency: usize) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(concurrency + 1).unwrap_or(u32::MAX))
            .connect(url)
            .await
            .map_err(err)?;
        let create = [
            format!(
                "CREATE TABLE {table} (id bigserial PRIMARY KEY, queue text NOT NULL, \
                 payload jsonb NOT NULL, run_at timestamptz NOT NULL DEFAULT now(), \
                 claimed_at timestamptz)"
            ),
            format!("CREATE INDEX ON {table} (queue, run_at, id)"),
        ];
        Table { pool, table }.created(&create).await
    }

    pub(super) async fn insert_batch_pg(&self, queue: &str, payloads: &[String]) -> Result<()> {
        let table = &self.table;
        sqlx::query(&format!(
            "INSERT INTO {table} (queue, payload) SELECT $1, p::jsonb FROM UNNEST($2::text[]) AS p"
        ))
        .bind(queue)
        .bind(payloads)
        .execute(&self.pool)
        .await
        .map_err(err)?;
        Ok(())
    }

    /// Inserts `singles` one at a time on the queue `single`.
    pub(super) async fn insert_singles_pg(&self, singles: &[String]) -> Result<()> {
        let insert_one = format!(
            "INSERT INTO {} (queue, payload) VALUES ('single', $1::jsonb)",
            self.table
        );
        for p in singles {
            sqlx::query(&insert_one)
                .bind(p)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Drains the `rows` rows of `queue` and measures the pickup floor.
    pub(super) async fn measure_pg(
        &self,
        queue: &str,
        rows: usize,
        concurrency: usize,
    ) -> Result<Rest> {
        let (pool, table) = (&self.pool, &self.table);
        let claim = Arc::new(format!(
            "UPDATE {table} SET claimed_at = now() WHERE id IN (SELECT id FROM {table} \
             WHERE queue = $1 AND claimed_at IS NULL ORDER BY run_at, id \
             LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING id"
        ));
        let delete = Arc::new(format!("DELETE FROM {table} WHERE id = ANY($1)"));
        let queue: Arc<str> = Arc::from(queue);
        let drain_per_s = drain(concurrency, rows, {
            let pool = pool.clone();
            move || {
                let (pool, claim, delete) = (pool.clone(), claim.clone(), delete.clone());
                let queue = queue.clone();
                async move {
                    let ids: Vec<i64> = sqlx::query_scalar(&claim)
                        .bind(&*queue)
                        .fetch_all(&pool)
                        .await
                        .map_err(err)?;
                    if !ids.is_empty() {
                        sqlx::query(&delete)
                            .bind(&ids)
                            .execute(&pool)
                            .await
                            .map_err(err)?;
                    }
                    Ok(ids.len())
                }
            }
        })
        .await?;
        let pickup = super::super::floor::postgres(pool, table).await?;
        Ok(Rest {
            drain_per_s,
            pickup: Some(pickup),
        })
    }
}
