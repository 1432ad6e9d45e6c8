//! What the SQL baselines share: a table of their own and its pool, inserts with `?`
//! placeholders (MySQL, SQLite), and the drain's loops.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use switchyard::Config;
use switchyard::{Error, Result};

use super::err;

/// Rows per batched insert and per claim, as in the bench.
pub(super) const BATCH: usize = 100;

/// A fresh table name for one baseline (the caller puts it in the configured schema, a
/// validated identifier).
pub(super) fn name() -> String {
    format!(
        "bench_bare_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A fresh table name for one baseline in the configured schema (a validated
/// identifier), each part between `quote`s.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) fn name_in(config: &Config, quote: char) -> String {
    let table = name();
    match &config.schema {
        Some(schema) => format!("{quote}{}{quote}.{quote}{table}{quote}", schema.as_str()),
        None => format!("{quote}{table}{quote}"),
    }
}

/// A SQL baseline's pool and table (quoted, maybe schema-qualified).
pub(super) struct Table<DB: sqlx::Database> {
    pub(super) pool: sqlx::Pool<DB>,
    pub(super) table: String,
}

impl<DB> Table<DB>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Runs `create` (the statements that make the table); on an error drops what
    /// was made and closes the pool.
    pub(super) async fn created(self, create: &[String]) -> Result<Self> {
        for sql in create {
            if let Err(e) = sqlx::query(sql).execute(&self.pool).await {
                let _ = self.close().await;
                return Err(err(e));
            }
        }
        Ok(self)
    }

    /// Deletes the rows of `queue` (a name of the bench's own, written into the
    /// statement: the pool's databases differ in their placeholders).
    pub(super) async fn delete_queue(&self, queue: &'static str) -> Result<()> {
        let sql = format!("DELETE FROM {} WHERE queue = '{queue}'", self.table);
        sqlx::query(&sql).execute(&self.pool).await.map_err(err)?;
        Ok(())
    }

    /// Drops the table and closes the pool.
    pub(super) async fn close(self) -> Result<()> {
        let dropped = sqlx::query(&format!("DROP TABLE IF EXISTS {}", self.table))
            .execute(&self.pool)
            .await;
        self.pool.close().await;
        dropped.map(|_| ()).map_err(err)
    }
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl<DB> Table<DB>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// Inserts `singles` one at a time on the queue `single` (MySQL, SQLite).
    pub(super) async fn insert_singles(&self, singles: &[String]) -> Result<()> {
        let insert_one = format!(
            "INSERT INTO {} (queue, payload) VALUES ('single', ?)",
            self.table
        );
        for p in singles {
            sqlx::query(&insert_one)
                .bind(p.as_str())
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Inserts `payloads` on `queue` in one multi-row statement (MySQL, SQLite).
    pub(super) async fn insert_batch(&self, queue: &str, payloads: &[String]) -> Result<()> {
        let rows = vec!["(?, ?)"; payloads.len()].join(", ");
        let sql = format!("INSERT INTO {} (queue, payload) VALUES {rows}", self.table);
        let mut q = sqlx::query(&sql);
        for p in payloads {
            q = q.bind(queue).bind(p.as_str());
        }
        q.execute(&self.pool).await.map_err(err)?;
        Ok(())
    }
}

/// Runs `concurrency` loops of `claim` until each comes back empty; jobs per second.
pub(super) async fn drain<F, Fut>(concurrency: usize, total: usize, claim: F) -> Result<f64>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<usize>> + Send,
{
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    // A JoinSet: on an error the other loops are aborted with it (on return), before
    // the table is dropped under them.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (claim, done) = (claim.clone(), done.clone());
        tasks.spawn(async move {
            loop {
                let n = claim().await?;
                if n == 0 {
                    return Ok::<(), Error>(());
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.map_err(err)??;
    }
    let elapsed = started.elapsed();
    let drained = done.load(Ordering::Relaxed);
    if drained != total {
        return Err(err(format!("drained {drained} rows of {total}")));
    }
    Ok(super::super::workload::rate(total, elapsed))
}
