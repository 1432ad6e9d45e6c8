//! The bare baseline on MySQL and MariaDB: InnoDB, the transport's isolation level, and
//! a claim that locks with `SKIP LOCKED`, marks (one commit) and deletes (another).

use std::sync::Arc;

use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection, MySql, MySqlPool};
use switchyard::Result;

use super::table::{drain, Table, BATCH};
use super::{err, Rest};

impl Table<MySql> {
    pub(super) async fn open_mysql(url: &str, table: String, concurrency: usize) -> Result<Self> {
        let pool = MySqlPoolOptions::new()
            .max_connections(u32::try_from(concurrency + 1).unwrap_or(u32::MAX))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // As the transport's sessions: no gap locks between claims.
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .connect(url)
            .await
            .map_err(err)?;
        let create = [format!(
            "CREATE TABLE {table} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             queue VARCHAR(191) NOT NULL, payload LONGTEXT NOT NULL, \
             run_at DATETIME(6) NOT NULL DEFAULT NOW(6), claimed_at DATETIME(6) NULL, \
             KEY claim_idx (queue, claimed_at, run_at, id)) \
             ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
        )];
        Table { pool, table }.created(&create).await
    }

    /// Drains the `rows` rows of `queue`.
    pub(super) async fn measure_mysql(
        &self,
        queue: &str,
        rows: usize,
        concurrency: usize,
    ) -> Result<Rest> {
        let lock = Arc::new(format!(
            "SELECT id FROM {} WHERE queue = ? AND claimed_at IS NULL \
             ORDER BY run_at, id LIMIT {BATCH} FOR UPDATE SKIP LOCKED",
            self.table
        ));
        let table = Arc::new(self.table.clone());
        let queue: Arc<str> = Arc::from(queue);
        let drain_per_s = drain(concurrency, rows, {
            let pool = self.pool.clone();
            move || {
                let (pool, lock, table) = (pool.clone(), lock.clone(), table.clone());
                let queue = queue.clone();
                async move {
                    loop {
                        match claim_and_delete(&pool, &lock, &queue, &table).await {
                            // A lost deadlock rolled the claim back: run it again.
                            Err(e)
                                if e.as_database_error()
                                    .and_then(|d| d.code())
                                    .is_some_and(|c| c == "40001") => {}
                            done => return done.map_err(err),
                        }
                    }
                }
            }
        })
        .await?;
        Ok(Rest {
            drain_per_s,
            pickup: None,
        })
    }
}

/// Claims up to 100 rows of `queue` (one commit), then deletes them (another).
async fn claim_and_delete(
    pool: &MySqlPool,
    lock: &str,
    queue: &str,
    table: &str,
) -> std::result::Result<usize, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let ids: Vec<i64> = sqlx::query_scalar(lock)
        .bind(queue)
        .fetch_all(&mut *tx)
        .await?;
    if ids.is_empty() {
        tx.commit().await?;
        return Ok(0);
    }
    let list = vec!["?"; ids.len()].join(", ");
    let claim = format!("UPDATE {table} SET claimed_at = NOW(6) WHERE id IN ({list})");
    let mut q = sqlx::query(&claim);
    for id in &ids {
        q = q.bind(id);
    }
    q.execute(&mut *tx).await?;
    tx.commit().await?;
    let delete = format!("DELETE FROM {table} WHERE id IN ({list})");
    let mut q = sqlx::query(&delete);
    for id in &ids {
        q = q.bind(id);
    }
    q.execute(&mut *conn).await?;
    Ok(ids.len())
}
