//! The bench's baseline: bare SQL on the same server (or SQLite file), in the same run, so that figures
//! from noisy, shared machines can be read as ratios. No queue contract (no leases,
//! tokens, attempts, dead letters or wake-ups): a minimal job table (`id`, `queue`,
//! `payload`, `run_at`, `claimed_at`, one index for the claim order), the same envelope
//! JSON as payload, inserts one by one and in batches of 100, and a drain at the bench's
//! concurrency that claims 100 rows at a time with `FOR UPDATE SKIP LOCKED` (one commit)
//! and then deletes them (another). SQLite has no `SKIP LOCKED` and one writer at a time:
//! its baseline writes through one connection, as the transport does, and its drain
//! claims 100 rows with one `UPDATE … RETURNING`, in WAL mode with `FULL` syncs (the
//! transport's defaults).
//!
//! On RabbitMQ the baseline is bare lapin: persistent messages to a durable quorum queue
//! through the default exchange, one publish at a time waiting for each confirm, then
//! batches of 100 with their confirms pipelined, and one consumer with a prefetch of 100
//! acking each message.
//!
//! On PostgreSQL and RabbitMQ the baseline ends with the pickup floor of a bare consumer
//! (`floor`), the one wake-up it has.

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::sync::Arc;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use std::time::Instant;

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

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn err(e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("bench baseline: {e}"))
}

/// Measures the baseline on the configured server or file (PostgreSQL, MySQL/MariaDB,
/// SQLite, RabbitMQ), in a table or queue of its own that is dropped afterwards.
pub(crate) async fn measure(
    config: &Config,
    payloads: &[String],
    single: usize,
    concurrency: usize,
) -> Result<Option<Baseline>> {
    #[cfg(feature = "amqp")]
    if config.backend == switchyard::BackendKind::RabbitMq {
        return amqp::measure(config.amqp_url.expose(), payloads, single)
            .await
            .map(Some);
    }
    let url = config.database_url.expose();
    match config.database_url.scheme().as_str() {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let table = match &config.schema {
                Some(schema) => format!("\"{}\".\"{}\"", schema.as_str(), bare_table()),
                None => format!("\"{}\"", bare_table()),
            };
            pg::measure(url, &table, payloads, single, concurrency)
                .await
                .map(Some)
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let table = match &config.schema {
                Some(schema) => format!("`{}`.`{}`", schema.as_str(), bare_table()),
                None => format!("`{}`", bare_table()),
            };
            my::measure(url, &table, payloads, single, concurrency)
                .await
                .map(Some)
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => lite::measure(url, &bare_table(), payloads, single, concurrency)
            .await
            .map(Some),
        _ => {
            let _ = (url, payloads, single, concurrency);
            Ok(None)
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

/// Inserts `single` payloads one at a time, then every payload in multi-row statements
/// of [`BATCH`] with `?` placeholders (MySQL, SQLite); both rates, per second.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
async fn insert_rates<DB>(
    pool: &sqlx::Pool<DB>,
    table: &str,
    payloads: &[String],
    single: usize,
) -> Result<(f64, f64)>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let insert_one = format!("INSERT INTO {table} (queue, payload) VALUES ('single', ?)");
    let started = Instant::now();
    for p in payloads.iter().cycle().take(single) {
        sqlx::query(&insert_one)
            .bind(p.as_str())
            .execute(pool)
            .await
            .map_err(err)?;
    }
    let single_per_s = single as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    for chunk in payloads.chunks(BATCH) {
        let rows = vec!["('drain', ?)"; chunk.len()].join(", ");
        let sql = format!("INSERT INTO {table} (queue, payload) VALUES {rows}");
        let mut q = sqlx::query(&sql);
        for p in chunk {
            q = q.bind(p.as_str());
        }
        q.execute(pool).await.map_err(err)?;
    }
    Ok((
        single_per_s,
        payloads.len() as f64 / started.elapsed().as_secs_f64(),
    ))
}

/// What a baseline measured, once its table is dropped and its pool closed (both even
/// when the measurement failed).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn dropped_after<DB>(
    pool: &sqlx::Pool<DB>,
    table: &str,
    measured: Result<Baseline>,
) -> Result<Baseline>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
{
    let dropped = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(pool)
        .await;
    pool.close().await;
    let measured = measured?;
    dropped.map_err(err)?;
    Ok(measured)
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

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use sqlx::postgres::PgPoolOptions;
    use sqlx::PgPool;

    pub(super) async fn measure(
        url: &str,
        table: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(concurrency + 1).unwrap_or(u32::MAX))
            .connect(url)
            .await
            .map_err(err)?;
        let measured = run(&pool, table, payloads, single, concurrency).await;
        dropped_after(&pool, table, measured).await
    }

    async fn run(
        pool: &PgPool,
        table: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
        sqlx::query(&format!(
            "CREATE TABLE {table} (id bigserial PRIMARY KEY, queue text NOT NULL, \
             payload jsonb NOT NULL, run_at timestamptz NOT NULL DEFAULT now(), \
             claimed_at timestamptz)"
        ))
        .execute(pool)
        .await
        .map_err(err)?;
        sqlx::query(&format!("CREATE INDEX ON {table} (queue, run_at, id)"))
            .execute(pool)
            .await
            .map_err(err)?;

        let insert_one =
            format!("INSERT INTO {table} (queue, payload) VALUES ('single', $1::jsonb)");
        let started = Instant::now();
        for p in payloads.iter().cycle().take(single) {
            sqlx::query(&insert_one)
                .bind(p)
                .execute(pool)
                .await
                .map_err(err)?;
        }
        let insert_single_per_s = single as f64 / started.elapsed().as_secs_f64();

        let insert_batch = format!(
            "INSERT INTO {table} (queue, payload) SELECT 'drain', p::jsonb FROM UNNEST($1::text[]) AS p"
        );
        let started = Instant::now();
        for chunk in payloads.chunks(BATCH) {
            sqlx::query(&insert_batch)
                .bind(chunk)
                .execute(pool)
                .await
                .map_err(err)?;
        }
        let insert_batch_per_s = payloads.len() as f64 / started.elapsed().as_secs_f64();

        let claim = Arc::new(format!(
            "UPDATE {table} SET claimed_at = now() WHERE id IN (SELECT id FROM {table} \
             WHERE queue = 'drain' AND claimed_at IS NULL ORDER BY run_at, id \
             LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING id"
        ));
        let delete = Arc::new(format!("DELETE FROM {table} WHERE id = ANY($1)"));
        let drain_per_s = drain(concurrency, payloads.len(), {
            let pool = pool.clone();
            move || {
                let (pool, claim, delete) = (pool.clone(), claim.clone(), delete.clone());
                async move {
                    let ids: Vec<i64> = sqlx::query_scalar(&claim)
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
        let (p50, p99) = super::super::floor::postgres(pool, table).await?;
        Ok(Baseline {
            insert_single_per_s,
            insert_batch_per_s,
            drain_per_s,
            pickup_p50_ms: Some(p50),
            pickup_p99_ms: Some(p99),
        })
    }
}

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::{Connection, MySqlPool};

    pub(super) async fn measure(
        url: &str,
        table: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
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
        let measured = run(&pool, table, payloads, single, concurrency).await;
        dropped_after(&pool, table, measured).await
    }

    async fn run(
        pool: &MySqlPool,
        table: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
        sqlx::query(&format!(
            "CREATE TABLE {table} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             queue VARCHAR(191) NOT NULL, payload LONGTEXT NOT NULL, \
             run_at DATETIME(6) NOT NULL DEFAULT NOW(6), claimed_at DATETIME(6) NULL, \
             KEY claim_idx (queue, claimed_at, run_at, id)) \
             ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
        ))
        .execute(pool)
        .await
        .map_err(err)?;

        let (insert_single_per_s, insert_batch_per_s) =
            insert_rates(pool, table, payloads, single).await?;

        let lock = Arc::new(format!(
            "SELECT id FROM {table} WHERE queue = 'drain' AND claimed_at IS NULL \
             ORDER BY run_at, id LIMIT {BATCH} FOR UPDATE SKIP LOCKED"
        ));
        let table = Arc::new(table.to_owned());
        let drain_per_s = drain(concurrency, payloads.len(), {
            let pool = pool.clone();
            move || {
                let (pool, lock, table) = (pool.clone(), lock.clone(), table.clone());
                async move {
                    loop {
                        match claim_and_delete(&pool, &lock, &table).await {
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
        Ok(Baseline {
            insert_single_per_s,
            insert_batch_per_s,
            drain_per_s,
            pickup_p50_ms: None,
            pickup_p99_ms: None,
        })
    }

    /// Claims up to 100 rows (one commit), then deletes them (another).
    async fn claim_and_delete(
        pool: &MySqlPool,
        lock: &str,
        table: &str,
    ) -> std::result::Result<usize, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar(lock).fetch_all(&mut *tx).await?;
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
}

#[cfg(feature = "sqlite")]
mod lite {
    use std::str::FromStr;

    use super::*;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use sqlx::SqlitePool;

    pub(super) async fn measure(
        url: &str,
        table: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(30));
        // One writer: more connections would only wait on SQLite's write lock.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(err)?;
        let measured = run(&pool, table, payloads, single, concurrency).await;
        dropped_after(&pool, &format!("\"{table}\""), measured).await
    }

    async fn run(
        pool: &SqlitePool,
        name: &str,
        payloads: &[String],
        single: usize,
        concurrency: usize,
    ) -> Result<Baseline> {
        let table = format!("\"{name}\"");
        sqlx::query(&format!(
            "CREATE TABLE {table} (id INTEGER PRIMARY KEY, queue TEXT NOT NULL, \
             payload TEXT NOT NULL, \
             run_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)), \
             claimed_at INTEGER)"
        ))
        .execute(pool)
        .await
        .map_err(err)?;
        sqlx::query(&format!(
            "CREATE INDEX \"{name}_claim\" ON {table} (queue, run_at, id)"
        ))
        .execute(pool)
        .await
        .map_err(err)?;

        let (insert_single_per_s, insert_batch_per_s) =
            insert_rates(pool, &table, payloads, single).await?;

        let claim = Arc::new(format!(
            "UPDATE {table} SET claimed_at = CAST(unixepoch('subsec') * 1000000 AS INTEGER) WHERE id IN \
             (SELECT id FROM {table} WHERE queue = 'drain' AND claimed_at IS NULL \
              ORDER BY run_at, id LIMIT {BATCH}) RETURNING id"
        ));
        let delete = Arc::new(format!(
            "DELETE FROM {table} WHERE id IN (SELECT value FROM json_each(?))"
        ));
        let drain_per_s = drain(concurrency, payloads.len(), {
            let pool = pool.clone();
            move || {
                let (pool, claim, delete) = (pool.clone(), claim.clone(), delete.clone());
                async move {
                    let ids: Vec<i64> = sqlx::query_scalar(&claim)
                        .fetch_all(&pool)
                        .await
                        .map_err(err)?;
                    if !ids.is_empty() {
                        let list = serde_json::to_string(&ids).map_err(err)?;
                        sqlx::query(&delete)
                            .bind(list)
                            .execute(&pool)
                            .await
                            .map_err(err)?;
                    }
                    Ok(ids.len())
                }
            }
        })
        .await?;
        Ok(Baseline {
            insert_single_per_s,
            insert_batch_per_s,
            drain_per_s,
            pickup_p50_ms: None,
            pickup_p99_ms: None,
        })
    }
}

#[cfg(feature = "amqp")]
mod amqp {
    use std::time::Instant;

    use futures_lite::StreamExt;
    use lapin::options::{
        BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
    use switchyard::{Error, Result};

    use super::Baseline;

    const BATCH: usize = 100;

    fn err(e: impl std::fmt::Display) -> Error {
        Error::InvalidInput(format!("bench baseline (bare lapin): {e}"))
    }

    async fn publish(ch: &Channel, queue: &str, body: &str) -> Result<PublisherConfirm> {
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .map_err(err)
    }

    pub(super) async fn measure(url: &str, payloads: &[String], single: usize) -> Result<Baseline> {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(err)?;
        let ch = conn.create_channel().await.map_err(err)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(err)?;
        let queue = format!("bench.bare.{}", uuid::Uuid::new_v4().simple());
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(queue.as_str().into(), durable, args)
            .await
            .map_err(err)?;
        // The queue goes whatever the measurement came to.
        let measured = run(&conn, &ch, &queue, payloads, single).await;
        let deleted = ch
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = conn.close(200, "done".into()).await;
        let measured = measured?;
        deleted.map_err(err)?;
        Ok(measured)
    }

    async fn run(
        conn: &Connection,
        ch: &Channel,
        queue: &str,
        payloads: &[String],
        single: usize,
    ) -> Result<Baseline> {
        let started = Instant::now();
        for body in payloads.iter().take(single) {
            publish(ch, queue, body).await?.await.map_err(err)?;
        }
        let insert_single_per_s =
            single.min(payloads.len()) as f64 / started.elapsed().as_secs_f64();

        let started = Instant::now();
        for chunk in payloads.chunks(BATCH) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for body in chunk {
                confirms.push(publish(ch, queue, body).await?);
            }
            for confirm in confirms {
                confirm.await.map_err(err)?;
            }
        }
        let insert_batch_per_s = payloads.len() as f64 / started.elapsed().as_secs_f64();

        let total = single.min(payloads.len()) + payloads.len();
        let started = Instant::now();
        let (consumer_ch, mut consumer) = super::super::floor::bare_consumer(conn, queue).await?;
        let mut drained = 0;
        while drained < total {
            let Some(delivery) = consumer.next().await else {
                return Err(err("the consumer ended early"));
            };
            delivery
                .map_err(err)?
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(err)?;
            drained += 1;
        }
        let drain_per_s = total as f64 / started.elapsed().as_secs_f64();
        super::super::floor::cancel(&consumer_ch, consumer).await?;
        let (p50, p99) = super::super::floor::amqp(conn, queue).await?;
        Ok(Baseline {
            insert_single_per_s,
            insert_batch_per_s,
            drain_per_s,
            pickup_p50_ms: Some(p50),
            pickup_p99_ms: Some(p99),
        })
    }
}
