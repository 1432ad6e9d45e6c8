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
//! The baseline is opened at the start of a run. Before anything is timed, the queue
//! publishes and drains up to 5,000 jobs and the baseline inserts and deletes as many
//! rows, or on RabbitMQ publishes and purges them (`warm_up`). Its single inserts then
//! run just before the queue's single publishes.
//! Its batched inserts take turns with the queue's batched publish, batch by batch (the
//! first of each pair alternating), and insert the same rows: each published batch's
//! envelope JSON as payload, serialised before either clock starts, and its queue name.
//! Measured minutes apart, as they once were, the two rates met different loads on a
//! shared machine, and their ratio moved by a third between runs. The drain of the rows
//! inserted in turns, and the pickup floor, come after the queue's run.
//!
//! On RabbitMQ the baseline is bare lapin: persistent messages to a durable quorum queue
//! through the default exchange, one publish at a time waiting for each confirm, batches
//! of 100 with their confirms pipelined, and one consumer with a prefetch of 100 acking
//! each message.
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
mod table;

use std::time::{Duration, Instant};

use serde::Serialize;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use switchyard::Error;
use switchyard::{Config, Result};

use super::workload::rate;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use table::Table;

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

/// The queue of the warm-up's rows, which no measured batch uses.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
const WARM: &str = "warm";

/// What a backend's baseline measures after the queue's run.
struct Rest {
    drain_per_s: f64,
    pickup: Option<(f64, f64)>,
}

/// The baseline of one run, open from before the queue's publishes (which its inserts
/// sit beside) until its other figures are measured.
pub(crate) struct Bare {
    backend: Backend,
    insert_single_per_s: f64,
    /// Time spent in batched inserts, and the rows they stored.
    batched: Duration,
    rows: usize,
    /// The one queue name of those rows, which the drain claims.
    queue: Option<String>,
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
            insert_single_per_s: 0.0,
            batched: Duration::ZERO,
            rows: 0,
            queue: None,
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
                let table = table::name_in(config, '"');
                Some(Backend::Pg(Table::open_pg(url, table, concurrency).await?))
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let table = table::name_in(config, '`');
                Some(Backend::My(
                    Table::open_mysql(url, table, concurrency).await?,
                ))
            }
            #[cfg(feature = "sqlite")]
            "sqlite" => Some(Backend::Lite(
                Table::open_sqlite(url, &table::name()).await?,
            )),
            _ => {
                let _ = (url, concurrency);
                None
            }
        })
    }

    /// Inserts `singles` one at a time (each its own commit, or confirm), timed.
    pub(crate) async fn insert_singles(&mut self, singles: &[String]) -> Result<()> {
        let started = Instant::now();
        match &mut self.backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => b.insert_singles_pg(singles).await?,
            #[cfg(feature = "mysql")]
            Backend::My(b) => b.insert_singles(singles).await?,
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => b.insert_singles(singles).await?,
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => b.insert_singles(singles).await?,
        }
        self.insert_single_per_s = rate(singles.len(), started.elapsed());
        Ok(())
    }

    /// Inserts `payloads` untimed, 1,000 at a time, then removes them: the baseline's
    /// warm-up, beside the queue's, first in the run, so that what is timed after it
    /// meets a table (or queue) that has taken and given up as many rows on both sides.
    pub(crate) async fn warm_up(&mut self, payloads: &[String]) -> Result<()> {
        for chunk in payloads.chunks(1_000) {
            self.insert(WARM, chunk).await?;
        }
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => b.delete_queue(WARM).await,
            #[cfg(feature = "mysql")]
            Backend::My(b) => b.delete_queue(WARM).await,
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => b.delete_queue(WARM).await,
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => b.purge().await,
        }
    }

    /// Inserts one batch: `payloads` on `queue`, timed. Every batch of a run is of one
    /// queue, whose rows the drain then counts.
    pub(crate) async fn insert_batch(&mut self, queue: &str, payloads: &[String]) -> Result<()> {
        match &self.queue {
            Some(q) if q != queue => {
                return Err(switchyard::Error::InvalidInput(format!(
                    "bench baseline: a batch of queue {queue} after batches of {q}"
                )))
            }
            Some(_) => {}
            None => self.queue = Some(queue.to_owned()),
        }
        let started = Instant::now();
        self.insert(queue, payloads).await?;
        self.batched += started.elapsed();
        self.rows += payloads.len();
        Ok(())
    }

    /// Inserts `payloads` on `queue` in one multi-row statement (RabbitMQ: publishes
    /// them on the baseline's own queue, confirms pipelined), neither timed nor counted.
    async fn insert(&self, queue: &str, payloads: &[String]) -> Result<()> {
        // Unused in a build with only the `amqp` feature.
        let _ = queue;
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => b.insert_batch_pg(queue, payloads).await,
            #[cfg(feature = "mysql")]
            Backend::My(b) => b.insert_batch(queue, payloads).await,
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => b.insert_batch(queue, payloads).await,
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => b.insert_batch(payloads).await,
        }
    }

    /// Measures the rest (the drain of the batched rows, the pickup floor), then drops
    /// the table or queue, whatever the measurement came to.
    pub(crate) async fn measure(self, concurrency: usize) -> Result<Baseline> {
        let Bare {
            backend,
            insert_single_per_s,
            batched,
            rows,
            queue,
        } = self;
        let queue = queue.unwrap_or_default();
        // Unused in a build with only the `amqp` feature.
        let _ = (&queue, concurrency);
        let rest = match backend {
            #[cfg(feature = "postgres")]
            Backend::Pg(b) => {
                let rest = b.measure_pg(&queue, rows, concurrency).await;
                first_error(rest, b.close().await)
            }
            #[cfg(feature = "mysql")]
            Backend::My(b) => {
                let rest = b.measure_mysql(&queue, rows, concurrency).await;
                first_error(rest, b.close().await)
            }
            #[cfg(feature = "sqlite")]
            Backend::Lite(b) => {
                let rest = b.measure_sqlite(&queue, rows, concurrency).await;
                first_error(rest, b.close().await)
            }
            #[cfg(feature = "amqp")]
            Backend::Amqp(b) => {
                let rest = b.measure(rows).await;
                first_error(rest, b.close().await)
            }
        }?;
        Ok(Baseline {
            insert_single_per_s,
            insert_batch_per_s: rate(rows, batched),
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
            not_dropped(&e);
        }
    }
}

/// What a measurement came to once its table or queue is dropped: the measurement's own
/// error first, the drop's said on stderr.
fn first_error(rest: Result<Rest>, closed: Result<()>) -> Result<Rest> {
    match (rest, closed) {
        (Ok(rest), closed) => closed.map(|()| rest),
        (Err(e), closed) => {
            if let Err(c) = closed {
                not_dropped(&c);
            }
            Err(e)
        }
    }
}

fn not_dropped(e: &switchyard::Error) {
    errln!("bench: could not drop the baseline's table or queue: {e}");
}
