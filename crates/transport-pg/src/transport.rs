use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use queue_core::connect::Endpoint;
use queue_core::sql::{
    labels_column, limit, micros, micros_between, pair_report, row_seq, ClaimBy, ClaimCounters,
    ClaimedRow, DeadRow, EngineState, HeldRow, KeptConnections, LeaseOp, OptimisticSlice, PairOp,
    Replayed, SqlBackend, StartMode, StatsRow, StoreSettings,
};
use queue_core::{
    text, AckReport, ClaimStrategy, DeadLetter, Envelope, LeaseToken, Published, QueueName,
    Reservation, Result,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row};
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use crate::connect;
use crate::error::{is_conflict, is_unique_violation, SqlxResultExt, TRANSPORT};
use crate::listener;
use crate::migrate::{check_existing, migrate, uninstall};
use crate::options::PgOptions;
use crate::sql::Statements;
use crate::standby;
use crate::status::PgStatusStore;

mod backend;
mod keys;
mod unique;

/// Rows per publish statement: bounds the size of one statement's arrays.
const PUBLISH_CHUNK: usize = 1_000;
/// How often an optimistic claim that lost a deadlock runs again.
const CONFLICT_RETRIES: usize = 5;

/// A [`Transport`](queue_core::Transport) over a PostgreSQL table (through the SQL engine
/// of [`queue_core::sql`]).
///
/// Claims are one statement each: `FOR UPDATE SKIP LOCKED` (the default) or an
/// optimistic compare-and-set; acks, start marks and publishes are batched into one
/// statement per batch. Publishes send a `NOTIFY` that wakes idle workers listening on
/// the same table, in any process.
pub struct PgTransport {
    pool: PgPool,
    connect: PgConnectOptions,
    sql: Arc<Statements>,
    keys: Arc<unique::KeySql>,
    options: PgOptions,
    schema: Option<String>,
    table: String,
    channel: String,
    /// Wake-ups of this process's idle workers (fed by publishes of this transport and
    /// by the `LISTEN` task) and the engine's pacing.
    engine: EngineState,
    listening: Mutex<bool>,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    /// Connections kept out of the pool for the hot path.
    kept: KeptConnections<PoolConnection<Postgres>>,
    status: Arc<PgStatusStore>,
}

impl fmt::Debug for PgTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTransport")
            .field("url", &self.options.url)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("claim", &self.options.claim)
            .finish_non_exhaustive()
    }
}

/// How many columns a claim returns per row ([`claimed_row`] reads them).
const CLAIMED_COLUMNS: usize = 8;

/// Reads a claimed row without decoding the envelope.
fn claimed_row(row: &PgRow) -> std::result::Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        seq: row.try_get(0)?,
        id: row.try_get(1)?,
        priority: i64::from(row.try_get::<i32, _>(2)?),
        attempts: i64::from(row.try_get::<i32, _>(3)?),
        available_at: row.try_get::<Option<i64>, _>(4)?.unwrap_or(0),
        last_error: row.try_get(5)?,
        envelope: row.try_get::<String, _>(6)?.into_bytes(),
        started: row.try_get(7)?,
    })
}

/// The rows of one publish statement as parallel arrays, validated and encoded.
#[derive(Default)]
struct PublishArrays {
    ids: Vec<String>,
    queues: Vec<String>,
    kinds: Vec<String>,
    priorities: Vec<i32>,
    attempts: Vec<i32>,
    due_us: Vec<i64>,
    expires_us: Vec<Option<i64>>,
    last_errors: Vec<Option<String>>,
    envelopes: Vec<String>,
    labels: Vec<Option<String>>,
    /// Ordering keys, and whether each message follows one of its key earlier in the
    /// batch; filled only when some message of the chunk has a key.
    keys: Vec<Option<String>>,
    follows: Vec<bool>,
    keyed: bool,
}

/// A publish, encoded: its statement-sized chunks and the locks of its ordering keys.
#[derive(Default)]
struct Encoded {
    chunks: Vec<PublishArrays>,
    locks: Vec<String>,
}

impl PgTransport {
    /// Validates the options, connects, and applies the schema (idempotently; many
    /// processes may do it at once). Configuration errors are raised before any
    /// connection is made.
    pub async fn connect(options: PgOptions) -> Result<Self> {
        let (table, schema) = StoreSettings {
            backend: "PostgreSQL",
            schemes: &["postgres", "postgresql"],
            url_form: "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
            url: &options.url,
            table: &options.table,
            schema: options.schema.as_deref(),
            lease: options.visibility_timeout,
            max_connections: options.max_connections,
        }
        .validate()?;
        connect::check_tls_settings(&options.url)?;
        let connect = connect::connect_options(&options.url)?;
        let endpoint = Endpoint::from_url("PostgreSQL", options.url.expose(), 5432);
        let mut first =
            connect::first_connection(&connect, &endpoint, options.connect_timeout).await?;
        let standby = standby::refuse_standby(&mut first, &endpoint).await;
        first.close().await.ok();
        standby?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            // No ping before every use: it doubles the round trips of the hot path. A
            // connection that broke (a server restart) fails its next statement with a
            // transient error, is dropped by the pool, and the caller retries.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| Box::pin(standby::still_usable(conn, meta)))
            .after_connect(|conn, _meta| Box::pin(standby::refuse_standby_conn(conn)))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await
            .backend()?;
        // Read-only tools open without creating: a mistyped schema or table is an error,
        // not a new empty store.
        if options.create {
            migrate(&pool, schema.as_deref(), &table).await?;
        } else {
            check_existing(&pool, schema.as_deref(), &table).await?;
        }
        let stop = CancellationToken::new();
        tracing::debug!(url = %options.url, schema, table, claim = %options.claim, "postgres transport ready");
        let kept = KeptConnections::for_pool(options.max_connections);
        Ok(PgTransport {
            status: Arc::new(PgStatusStore::new(
                pool.clone(),
                connect.clone(),
                schema.as_deref(),
                &table,
                stop.clone(),
            )),
            pool,
            connect,
            sql: Arc::new(Statements::new(schema.as_deref(), &table)),
            keys: Arc::new(unique::KeySql::new(schema.as_deref(), &table)),
            channel: listener::channel(schema.as_deref(), &table),
            schema,
            table,
            options,
            engine: EngineState::default(),
            listening: Mutex::new(false),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            kept,
        })
    }

    /// The options this transport runs with.
    pub fn options(&self) -> &PgOptions {
        &self.options
    }

    /// The connection pool, for the caller's own queries and transactions.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The `NOTIFY` channel that publishes to this table signal.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// What optimistic claims have lost to competitors so far.
    pub fn claim_counters(&self) -> ClaimCounters {
        self.engine.claims.read()
    }

    /// Closes the pool and stops listening.
    pub async fn close(&self) {
        self.stop.cancel();
        self.kept.close();
        self.pool.close().await;
    }

    /// Drops this transport's tables (jobs, dead letters, status and every other table
    /// its migrations made), messages and all. For tests, benchmarks and tearing down a
    /// tenant; the schema itself is left in place.
    pub async fn drop_store(&self) -> Result<()> {
        uninstall(&self.pool, self.schema.as_deref(), &self.table).await
    }

    /// Publishes inside the caller's own transaction (the transactional outbox): the
    /// message exists if and only if the transaction commits, and idle workers are woken
    /// at the commit.
    ///
    /// ```no_run
    /// # async fn f(t: &transport_pg::PgTransport, env: queue_core::Envelope) -> queue_core::Result<()> {
    /// let mut tx = t.pool().begin().await.map_err(|e| queue_core::Error::backend("postgres", false, e))?;
    /// // … the caller's own writes on `tx` …
    /// t.publish_tx(&mut tx, env).await?;
    /// tx.commit().await.map_err(|e| queue_core::Error::backend("postgres", false, e))?;
    /// # Ok(()) }
    /// ```
    pub async fn publish_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, Postgres>,
        envelope: Envelope,
    ) -> Result<Published> {
        self.publish_batch_tx(tx, vec![envelope]).await
    }

    /// Publishes several messages inside the caller's own transaction. Messages with
    /// ordering keys or unique keys need it to run at READ COMMITTED (the default).
    pub async fn publish_batch_tx(
        &self,
        tx: &mut sqlx::Transaction<'_, Postgres>,
        mut envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        if envelopes.iter().any(|e| e.unique.is_some()) {
            for env in &mut envelopes {
                env.normalize_for_store()?;
                env.check_size(self.options.max_payload_bytes)?;
            }
            self.require_read_committed(tx, "unique keys").await?;
            return self.publish_with_keys(tx, envelopes).await;
        }
        if envelopes.iter().any(|e| e.ordering_key.is_some()) {
            self.require_read_committed(tx, "ordering keys").await?;
        }
        self.store_all_in(tx, envelopes).await?;
        Ok(Published::all_stored())
    }

    /// The plan PostgreSQL chooses for the skip-locked claim on `queue` (`EXPLAIN`
    /// without costs), of messages carrying one of `labels` when there are any, to check
    /// that the claim stays an index scan at any depth.
    pub async fn explain_claim(
        &self,
        queue: &QueueName,
        max: usize,
        labels: &[String],
    ) -> Result<String> {
        let sql = if labels.is_empty() {
            &self.sql.explain_claim
        } else {
            &self.sql.explain_claim_labels
        };
        let mut query = sqlx::query_scalar(sql)
            .bind(Uuid::nil())
            .bind(micros(self.options.visibility_timeout))
            .bind(queue.as_str())
            .bind(limit(max))
            .bind(false)
            .bind("explain");
        if !labels.is_empty() {
            query = query.bind(queue_core::labels::needles(labels));
        }
        let rows: Vec<String> = query.fetch_all(&self.pool).await.backend()?;
        Ok(rows.join("\n"))
    }

    /// Validates every envelope (size) before anything is stored, and splits them into
    /// statement-sized chunks.
    fn encode(&self, envelopes: Vec<Envelope>) -> Result<Encoded> {
        let local_now = Utc::now();
        let mut chunks = Vec::with_capacity(envelopes.len().div_ceil(PUBLISH_CHUNK));
        let mut cur = PublishArrays::default();
        let mut locks: HashSet<String> = HashSet::new();
        let keyed = envelopes.iter().any(|e| e.ordering_key.is_some());
        for mut env in envelopes {
            let labels = labels_column(&mut env)?;
            let json = env.to_json();
            if json.len() > self.options.max_payload_bytes {
                env.check_size(self.options.max_payload_bytes)?;
            }
            // Delay and expiry become offsets from the publisher's clock, applied to the
            // server's: the publisher's clock skew cannot shift them, and a due time
            // carried over from another backend keeps its place.
            cur.due_us
                .push(micros_between(local_now, env.available_at).max(0));
            cur.expires_us
                .push(env.expires_at.map(|t| micros_between(local_now, t)));
            cur.ids.push(env.id.to_string());
            cur.queues.push(env.queue.as_str().to_owned());
            // The columns are indexes and operator views; the envelope JSON, whose
            // escapes make any text storable, keeps every field as published.
            cur.kinds.push(text::kind_column(&env.kind));
            cur.priorities.push(i32::from(env.priority));
            cur.attempts
                .push(i32::try_from(env.attempts).unwrap_or(i32::MAX));
            cur.last_errors
                .push(env.last_error.as_deref().map(text::error_text));
            cur.envelopes.push(json);
            cur.labels.push(labels);
            if keyed {
                let lock = env
                    .ordering_key
                    .as_deref()
                    .map(|k| keys::key_lock(env.queue.as_str(), k));
                // A second message of a key in the batch waits for the first.
                cur.follows.push(lock.is_some_and(|l| !locks.insert(l)));
                cur.keys.push(env.ordering_key.take());
                cur.keyed = true;
            }
            if cur.ids.len() == PUBLISH_CHUNK {
                chunks.push(std::mem::take(&mut cur));
            }
        }
        if !cur.ids.is_empty() {
            chunks.push(cur);
        }
        let mut locks: Vec<String> = locks.into_iter().collect();
        locks.sort();
        Ok(Encoded { chunks, locks })
    }

    /// Runs the publish statement for `rows` on `conn`: the plain insert when `fresh`
    /// (an id already stored fails it), else the one that skips stored ids; how many
    /// rows it stored.
    async fn insert_with(
        &self,
        fresh: bool,
        conn: &mut PgConnection,
        rows: &PublishArrays,
    ) -> std::result::Result<usize, sqlx::Error> {
        let sql = match (rows.keyed, fresh) {
            (false, true) => &self.sql.publish_fresh,
            (false, false) => &self.sql.publish,
            (true, true) => &self.sql.publish_keyed_fresh,
            (true, false) => &self.sql.publish_keyed,
        };
        let mut query = sqlx::query(sql)
            .bind(&rows.ids)
            .bind(&rows.queues)
            .bind(&rows.kinds)
            .bind(&rows.priorities)
            .bind(&rows.attempts)
            .bind(&rows.due_us)
            .bind(&rows.expires_us)
            .bind(&rows.last_errors)
            .bind(&rows.envelopes)
            .bind(&self.channel)
            .bind(self.options.notify)
            .bind(&rows.labels);
        if rows.keyed {
            query = query.bind(&rows.keys).bind(&rows.follows);
        }
        let stored: i64 = query.fetch_one(conn).await?.try_get(1)?;
        Ok(usize::try_from(stored).unwrap_or(0))
    }

    /// Stores every chunk of `batch` on `conn` (a transaction) under the locks of its
    /// ordering keys. A message that stored nothing (its id was stored, live or dead)
    /// holds no key, so a later message of its key parked behind it in the batch is
    /// handed the key, as it would have found it free published alone.
    async fn insert_chunks(
        &self,
        fresh: bool,
        conn: &mut PgConnection,
        batch: &Encoded,
    ) -> std::result::Result<(), sqlx::Error> {
        self.lock_keys(conn, &batch.locks).await?;
        let mut skipped = false;
        for chunk in &batch.chunks {
            skipped |= self.insert_with(fresh, conn, chunk).await? < chunk.ids.len();
        }
        if skipped {
            self.hand_on_skipped(conn, batch).await?;
        }
        Ok(())
    }

    /// Stores the batch atomically (see [`Self::insert_with`] for `fresh`), under the
    /// locks of its ordering keys.
    async fn store(&self, fresh: bool, batch: &Encoded) -> std::result::Result<(), sqlx::Error> {
        if let ([chunk], true) = (&batch.chunks[..], batch.locks.is_empty()) {
            // One statement is atomic on its own: no explicit transaction needed.
            let mut conn = self.kept.take_or(self.pool.acquire()).await?;
            self.insert_with(fresh, &mut conn, chunk).await?;
            self.kept.keep(conn);
        } else {
            let mut tx = self.pool.begin().await?;
            self.insert_chunks(fresh, &mut tx, batch).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// Starts the `LISTEN` task the first time a worker asks for a wake-up signal (and
    /// only inside a tokio runtime).
    fn ensure_listening(&self) {
        if !self.options.notify {
            return;
        }
        let mut listening = self.listening.lock().unwrap_or_else(|e| e.into_inner());
        if *listening {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(listener::listen(
                self.connect.clone(),
                self.channel.clone(),
                self.engine.wakers.clone(),
                self.stop.clone(),
            ));
            *listening = true;
        }
    }

    /// Moves waiting rows whose time has come (due delays, lapsed leases) into the claim
    /// index, returning how many. An idle poll only reads.
    async fn promote(&self) -> Result<u64> {
        // These statements have no parameters, so PostgreSQL would plan them once per
        // connection and keep that plan: made on a new, empty table it is a sequential
        // scan for ever. Unnamed statements are planned afresh (and cheaply) each time.
        let mut conn = self.kept.take_or(self.pool.acquire()).await.backend()?;
        let any: bool = sqlx::query_scalar(&self.sql.any_due)
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
            .backend()?;
        self.kept.keep(conn);
        if !any {
            return Ok(0);
        }
        Ok(sqlx::query(&self.sql.promote_due)
            .persistent(false)
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected())
    }

    /// The candidates of an optimistic claim, read without locks.
    async fn candidates(
        &self,
        queue: &QueueName,
        window: usize,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<i64>> {
        let candidates = if by.needles.is_empty() {
            sqlx::query_scalar(&self.sql.claim_candidates)
                .bind(queue.as_str())
                .bind(limit(window))
        } else {
            sqlx::query_scalar(&self.sql.claim_candidates_labels)
                .bind(queue.as_str())
                .bind(limit(window))
                .bind(&by.needles)
        };
        candidates.fetch_all(&self.pool).await.backend()
    }

    /// The compare-and-set of an optimistic claim on `seqs`; run again should it lose a
    /// deadlock (to a statement that locks rows in another order).
    async fn take(
        &self,
        queue: &QueueName,
        seqs: &[i64],
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>> {
        let lease = micros(self.options.visibility_timeout);
        let mut conflicts = 0;
        let rows = loop {
            let attempt = sqlx::query(&self.sql.claim_optimistic)
                .bind(token.0)
                .bind(lease)
                .bind(queue.as_str())
                .bind(limit(seqs.len()))
                .bind(start as i32)
                .bind(seqs)
                .bind(by.holder)
                .fetch_all(&self.pool)
                .await;
            match attempt {
                Err(err) if self.retry_conflict(&err, &mut conflicts) => {}
                other => break other.backend()?,
            }
        };
        rows.iter()
            .map(claimed_row)
            .collect::<std::result::Result<Vec<_>, _>>()
            .backend()
    }

    /// An optimistic round in one statement (see [`crate::sql::CLAIM_OPTIMISTIC_ROUND`]):
    /// how many candidates the window held, and the rows claimed.
    async fn round(
        &self,
        queue: &QueueName,
        slice: OptimisticSlice,
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<(usize, Vec<ClaimedRow>)> {
        let sql = if by.needles.is_empty() {
            &self.sql.claim_optimistic_round
        } else {
            &self.sql.claim_optimistic_round_labels
        };
        let mut conflicts = 0;
        let rows = loop {
            let mut query = sqlx::query(sql)
                .bind(token.0)
                .bind(micros(self.options.visibility_timeout))
                .bind(queue.as_str())
                .bind(limit(slice.want))
                .bind(start as i32)
                .bind(by.holder)
                .bind(limit(slice.window))
                .bind(limit(slice.slot));
            if !by.needles.is_empty() {
                query = query.bind(&by.needles);
            }
            match query.fetch_all(&self.pool).await {
                Err(err) if self.retry_conflict(&err, &mut conflicts) => {}
                other => break other.backend()?,
            }
        };
        let mut seen = 0;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            seen = row.try_get::<i64, _>(CLAIMED_COLUMNS).backend()?;
            if row.try_get::<Option<i64>, _>(0).backend()?.is_some() {
                claimed.push(claimed_row(row).backend()?);
            }
        }
        Ok((usize::try_from(seen).unwrap_or(0), claimed))
    }

    /// Whether a claim statement that lost a deadlock or a serialisation conflict runs
    /// again: up to [`CONFLICT_RETRIES`] times, each counted.
    fn retry_conflict(&self, err: &sqlx::Error, conflicts: &mut usize) -> bool {
        if !is_conflict(err) || *conflicts >= CONFLICT_RETRIES {
            return false;
        }
        *conflicts += 1;
        self.engine.claims.conflict();
        true
    }

    /// Moves the row `seq` that this transport holds under `token` to the dead-letter
    /// store, byte for byte, in one statement. `false` when the lease is gone.
    async fn move_leased_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
    ) -> Result<bool> {
        let moved = sqlx::query(&self.sql.move_leased_to_dead)
            .bind(seq)
            .bind(token.0)
            .bind(text::reason_text(reason))
            .bind(error.map(text::error_text))
            .execute(&self.pool)
            .await
            .backend()?
            .rows_affected();
        Ok(moved == 1)
    }

    /// Runs a batch statement over (id, token) pairs (and an optional lease) that returns
    /// the pairs it touched; the others lost their lease.
    async fn pairs(
        &self,
        sql: &str,
        reservations: &[Reservation],
        lease: Option<i64>,
    ) -> Result<AckReport> {
        let (seqs, tokens) = seq_ordered(reservations);
        let mut query = sqlx::query_as(sql).bind(&seqs).bind(&tokens);
        if let Some(lease) = lease {
            query = query.bind(lease);
        }
        // Matched on (seq, token): a batch may hold a stale copy of a message beside the
        // current one.
        let mut conn = self.kept.take_or(self.pool.acquire()).await.backend()?;
        let touched: Vec<(String, Uuid)> = query.fetch_all(&mut *conn).await.backend()?;
        self.kept.keep(conn);
        let touched: HashSet<(String, Uuid)> = touched.into_iter().collect();
        Ok(pair_report(reservations, &touched))
    }
}

/// The seqs and tokens of a batch as parallel arrays, in seq order, so that the rows are
/// locked in that order, as optimistic claims lock theirs: such a claim keeps the lock
/// of a row it found claimed by someone else and skipped, and a batch locking in another
/// order could deadlock with it (a second's stall on both sides).
fn seq_ordered(reservations: &[Reservation]) -> (Vec<i64>, Vec<Uuid>) {
    let mut pairs: Vec<(i64, Uuid)> = reservations
        .iter()
        .map(|r| (row_seq(r), r.token().0))
        .collect();
    pairs.sort_unstable();
    pairs.into_iter().unzip()
}

fn count(n: Option<i64>) -> u64 {
    u64::try_from(n.unwrap_or(0)).unwrap_or(0)
}

impl PgTransport {
    /// The store of job status and results beside this transport's messages.
    pub fn status_store(&self) -> Arc<dyn queue_core::status::StatusStore> {
        self.status.clone()
    }
}
