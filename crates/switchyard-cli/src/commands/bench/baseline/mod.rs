//! The bench's baseline: bare SQL on the same server (or SQLite file), in the same run, so that figures
//! from noisy, shared machines can be read as ratios. No queue contract (no leases,
//! tokens, attempts, dead letters or wake-ups): a minimal job table (`id`, `queue`,
//! `payload`, `run_at`, `claimed_at`, one index for the claim order), inserts one by one
//! and in batches of 100, and a drain at the bench's concurrency that claims 100 rows at
//! a time with `FOR UPDATE SKIP LOCKED` (one commit) and then deletes them (another).
//! SQLite has no `SKIP LOCKED` and one writer at a time: its baseline writes through one
//! connection, as the transport does, and its drain claims 100 rows with one
//! `UPDATE … RETURNING`, in WAL mode with `FULL` syncs (the transport's defaults).
//!
//! The batched inserts take turns with the queue's batched publish, batch by batch (the
//! first of each pair alternating), and insert the same rows: each published batch's
//! envelope JSON as payload and its queue name. Measured minutes apart, as they once
//! were, the two rates met different loads on a shared machine, and their ratio moved by
//! a third between runs.
//!
//! On RabbitMQ the baseline is bare lapin: persistent messages to a durable quorum queue
//! through the default exchange, one publish at a time waiting for each confirm, then
//! batches of 100 with their confirms pipelined, and one consumer with a prefetch of 100
//! acking each message.
//!
//! On PostgreSQL and RabbitMQ the baseline ends with the pickup floor of a bare consumer
//! (`floor`), the one wake-up it has.

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "sqlite")]
mod lite;
#[cfg(feature = "mysql")]
mod my;
#[cfg(feature = "postgres")]
mod pg;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use switchyard::Error;
use switchyard::{Config, Result};

/// Rows per batched insert and per claim, as in the bench.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
const BATCH: usize = 100;

/// Bare-SQL throughput on the bench's server, and the pickup of a bare consumer where
/// the server can wake one (PostgreSQL's `LISTEN`, a RabbitMQ consumer).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Baseline {
    pub(crate) insert_single_per_s: f64,
    pub(crate) insert_batch_per_s: f64,
    pub(crate) drain_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pickup_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pickup_p99_ms: Option<f64>,
}

/// What a backend's baseline measures after the batched inserts.
struct Rest {
    insert_single_per_s: f64,
    drain_per_s: f64,
    pickup: Option<(f64, f64)>,
}

/// The baseline of one run, open from before the queue's batched publish (whose
/// batches its inserts take turns with) until its other figures are measured.
pub(crate) struct Bare {
    backend: Backend,
    /// Time spent in batched inserts, and the rows they stored.
    batched: Duration,
    rows: usize,
    /// The queue name of those rows, which the drain claims.
    queue: String,
}

enum Backend {
    #[cfg(feature = "postgres")]
    Pg(Table<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    My(Table<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Lite(Table<sqlx::Sqlite>),
    /// Boxed: a lapin connection and channel are ten times a pool's size.
    #[cfg(feature = "amqp")]
    Amqp(Box<amqp::Bare>),
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn err(e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("bench baseline: {e}"))
}

impl Bare {
    /// Creates the baseline's table (or queue) on the configured server or file
    /// (PostgreSQL, MySQL/MariaDB, SQLite, RabbitMQ); `None` where there is no baseline.
    pub(crate) async fn open(config: &Config, concurrency: usize) -> Result<Option<Bare>> {
        let backend = match Self::backend(config, concurrency).await? {
            Some(backend) => backend,
            None => return Ok(None),
        };
        Ok(Some(Bare {
            backend,
            batched: Duration::ZERO,
            rows: 0,
            queue: String::new(),
        }))
    }

    async fn backend(config: &Config, concurrency: usize) -> Result<Option<Backend>> {
        #[cfg(feature = "amqp")]
        if config.backend == switchyard::BackendKind::RabbitMq {
            let bare = amqp::Bare::open(config.amqp_url.expose()).await?;
            return Ok(Some(Backend::Amqp(Box::new(bare))));
        }
        let url = config.database_url.expose();
        Ok(match config.database_url.scheme().as_str() {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let table = bare_table_in(config, '"');
                Some(Backend::Pg(Table::open_pg(url, table, concurrency).await?))
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let table = bare_table_in(config, '`');
                Some(Backend::My(
                    Table::open_mysql(url, table, concurrency).await?,
                ))
            }
            #[cfg(feature = "sqlite")]
            "sqlite" => Some(Backend::Lite(Table::open_sqlite(url, &bare_table()).await?)),
            _ => {
                let _ = (url, concurrency);
                None
            }
        })
    }

    /// Inserts one batch: `payloads` on `queue`, timed.
    pub(crate) async fn insert_batch(&mut self, queue: &str, payloads: &[String]) -> Result<()> {
        queue.clone_into(&mut self.queue);
        let started = Instant::now();
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => b.insert_batch(queue, payloads).await?,
            #[cfg(feature = "mysql")]
            Backend::My(b) => insert_rows(b, queue, payloads).await?,
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => insert_rows(b, queue, payloads).await?,
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => b.insert_batch(payloads).await?,
        }
        self.batched += started.elapsed();
        self.rows += payloads.len();
        Ok(())
    }

    /// Measures the rest (`singles` inserted one by one, the drain of the batched rows,
    /// the pickup floor), then drops the table or queue, whatever the measurement came
    /// to.
    pub(crate) async fn measure(self, singles: &[String], concurrency: usize) -> Result<Baseline> {
        let Bare {
            backend,
            batched,
            rows,
            queue,
        } = self;
        let _ = (&queue, concurrency);
        let rest = match backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => {
                let rest = b.measure(&queue, rows, singles, concurrency).await;
                b.close().await.and(rest)
            }
            #[cfg(feature = "mysql")]
            Backend::My(b) => {
                let rest = b.measure(&queue, rows, singles, concurrency).await;
                b.close().await.and(rest)
            }
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => {
                let rest = b.measure(&queue, rows, singles, concurrency).await;
                b.close().await.and(rest)
            }
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => {
                let rest = b.measure(rows, singles).await;
                b.close().await.and(rest)
            }
        }?;
        Ok(Baseline {
            insert_single_per_s: rest.insert_single_per_s,
            insert_batch_per_s: rows as f64 / batched.as_secs_f64(),
            drain_per_s: rest.drain_per_s,
            pickup_p50_ms: rest.pickup.map(|p| p.0),
            pickup_p99_ms: rest.pickup.map(|p| p.1),
        })
    }

    /// Drops the table or queue without measuring more (the queue's run failed).
    pub(crate) async fn discard(self) {
        let closed = match self.backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => b.close().await,
            #[cfg(feature = "mysql")]
            Backend::My(b) => b.close().await,
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => b.close().await,
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => b.close().await,
        };
        if let Err(e) = closed {
            errln!("bench: could not drop the baseline's table or queue: {e}");
        }
    }
}

/// A fresh table name for one baseline (the caller puts it in the configured schema, a
/// validated identifier).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn bare_table() -> String {
    format!(
        "bench_bare_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A fresh table name for one baseline in the configured schema (a validated
/// identifier), each part between `quote`s.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn bare_table_in(config: &Config, quote: char) -> String {
    let table = bare_table();
    match &config.schema {
        Some(schema) => format!("{quote}{}{quote}.{quote}{table}{quote}", schema.as_str()),
        None => format!("{quote}{table}{quote}"),
    }
}

/// A SQL baseline's pool and table (quoted, maybe schema-qualified).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
struct Table<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    table: String,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl<DB> Table<DB>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
{
    /// Runs `create` (the statements that make the table); on an error drops what
    /// was made and closes the pool.
    async fn created(self, create: &[String]) -> Result<Self> {
        for sql in create {
            if let Err(e) = sqlx::query(sql).execute(&self.pool).await {
                let _ = self.close().await;
                return Err(err(e));
            }
        }
        Ok(self)
    }

    /// Drops the table and closes the pool.
    async fn close(self) -> Result<()> {
        let dropped = sqlx::query(&format!("DROP TABLE IF EXISTS {}", self.table))
            .execute(&self.pool)
            .await;
        self.pool.close().await;
        dropped.map(|_| ()).map_err(err)
    }
}

/// Inserts `singles` one at a time on the queue `single`, with `?` placeholders (MySQL,
/// SQLite); the rate, per second.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
async fn insert_singles<DB>(pool: &sqlx::Pool<DB>, table: &str, singles: &[String]) -> Result<f64>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let insert_one = format!("INSERT INTO {table} (queue, payload) VALUES ('single', ?)");
    let started = Instant::now();
    for p in singles {
        sqlx::query(&insert_one)
            .bind(p.as_str())
            .execute(pool)
            .await
            .map_err(err)?;
    }
    Ok(singles.len() as f64 / started.elapsed().as_secs_f64())
}

/// Inserts `payloads` on `queue` in one multi-row statement with `?` placeholders
/// (MySQL, SQLite).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
async fn insert_rows<DB>(bare: &Table<DB>, queue: &str, payloads: &[String]) -> Result<()>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let rows = vec!["(?, ?)"; payloads.len()].join(", ");
    let sql = format!("INSERT INTO {} (queue, payload) VALUES {rows}", bare.table);
    let mut q = sqlx::query(&sql);
    for p in payloads {
        q = q.bind(queue).bind(p.as_str());
    }
    q.execute(&bare.pool).await.map_err(err)?;
    Ok(())
}

/// Runs `concurrency` loops of `claim` until each comes back empty; jobs per second.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn drain<F, Fut>(concurrency: usize, total: usize, claim: F) -> Result<f64>
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
    let elapsed = started.elapsed().as_secs_f64();
    let drained = done.load(Ordering::Relaxed);
    if drained != total {
        return Err(err(format!("drained {drained} rows of {total}")));
    }
    Ok(total as f64 / elapsed)
}
