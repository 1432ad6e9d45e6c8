//! Unique keys on MySQL: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction.

use queue_core::sql::unique::{publish_unique, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey};
use queue_core::Published;

use super::*;

/// How many times a publish with unique keys runs again after losing a deadlock (two
/// batches taking the same keys in different orders) or a lock wait.
const DEADLOCK_TRIES: usize = 5;

/// Whether a job with the id is stored, live, dead (a tombstone) or moved in dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM `switchyard_jobs` WHERE id = ?)
    OR EXISTS (SELECT 1 FROM `switchyard_jobs_dead` WHERE id = ?)";

/// The key's row, locked: its job, scope, whether its hold lasts, and its age in µs.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > {NOW}, 0),
       CAST({NOW} AS SIGNED) - first_at
  FROM `switchyard_jobs_unique` WHERE queue = ? AND unique_key = ? FOR UPDATE";

/// Creates a key's row; nothing when another transaction created it first.
const INSERT_KEY: &str = "INSERT IGNORE INTO `switchyard_jobs_unique`
    (queue, unique_key, id, scope, hold_until, first_at)
    VALUES (?, ?, ?, ?, {NOW} + ?, {NOW})";

/// Points a key's row at a new job.
const MOVE_KEY: &str = "UPDATE `switchyard_jobs_unique`
   SET id = ?, scope = ?, hold_until = {NOW} + ?, first_at = {NOW}
 WHERE queue = ? AND unique_key = ?";

/// The state of a key's job (a tombstone is a gone job): claimed or not, and its
/// envelope.
const HOLDER: &str =
    "SELECT token IS NOT NULL, envelope FROM `switchyard_jobs` WHERE id = ? AND ready < 2";

/// Debounces a job no worker has claimed: its new envelope, due in some µs (out of the
/// claim order until then, as a delayed publish).
const REPLACE_JOB: &str = "UPDATE `switchyard_jobs`
   SET envelope = ?, available_at = {NOW} + ?, visible_at = {NOW} + ?, ready = (? <= 0)
 WHERE id = ? AND token IS NULL AND ready < 2";

/// Holds an acked job's key for its `done` period, while the job is still held under
/// its token.
const HOLD_KEY: &str = "UPDATE `switchyard_jobs_unique` u SET hold_until = {NOW} + ?
 WHERE u.queue = ? AND u.unique_key = ? AND u.id = ?
   AND EXISTS (SELECT 1 FROM `switchyard_jobs` j WHERE j.id = ? AND j.token = ?)";

/// The key table's statements, specialised for this transport's table.
#[derive(Debug)]
pub(crate) struct KeySql {
    id_stored: String,
    lock_key: String,
    insert_key: String,
    move_key: String,
    holder: String,
    replace_job: String,
    hold_key: String,
}

impl KeySql {
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Self {
        let s = |sql: &str| crate::sql::specialise(sql, schema, table);
        KeySql {
            id_stored: s(ID_STORED),
            lock_key: s(LOCK_KEY),
            insert_key: s(INSERT_KEY),
            move_key: s(MOVE_KEY),
            holder: s(HOLDER),
            replace_job: s(REPLACE_JOB),
            hold_key: s(HOLD_KEY),
        }
    }
}

/// The statements on one transaction.
struct MySqlKeys<'a> {
    t: &'a MySqlTransport,
    conn: &'a mut MySqlConnection,
}

#[async_trait]
impl KeyStatements for MySqlKeys<'_> {
    async fn id_stored(&mut self, id: &str) -> Result<bool> {
        let stored: i64 = sqlx::query_scalar(&self.t.keys.id_stored)
            .bind(id)
            .bind(id)
            .fetch_one(&mut *self.conn)
            .await
            .backend()?;
        Ok(stored != 0)
    }

    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>> {
        let row: Option<(Vec<u8>, Vec<u8>, i64, i64)> = sqlx::query_as(&self.t.keys.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us)| KeyRow {
            id: lossy(id),
            scope: lossy(scope),
            held: held != 0,
            age_us,
        }))
    }

    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool> {
        let done = sqlx::query(&self.t.keys.insert_key)
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }

    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()> {
        sqlx::query(&self.t.keys.move_key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .bind(take.queue)
            .bind(take.key)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn holder(&mut self, id: &str) -> Result<KeyHolder> {
        let row: Option<(i64, Vec<u8>)> = sqlx::query_as(&self.t.keys.holder)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((claimed, _)) if claimed != 0 => KeyHolder::Claimed,
            Some((_, envelope)) => KeyHolder::Waiting(lossy(envelope)),
        })
    }

    async fn insert_job(&mut self, env: &Envelope) -> Result<()> {
        let rows = queue_core::sql::encoded(vec![env.clone()], self.t.options.max_payload_bytes)?;
        self.t.insert_keyed(self.conn, &rows).await.backend()
    }

    async fn replace_job(&mut self, id: &str, envelope: &str, due_us: i64) -> Result<bool> {
        let done = sqlx::query(&self.t.keys.replace_job)
            .bind(envelope)
            .bind(due_us)
            .bind(due_us)
            .bind(due_us)
            .bind(id)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }
}

impl MySqlTransport {
    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction): those
    /// without first, as one batch, then each with a key in turn.
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut MySqlConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        let (unique, plain): (Vec<Envelope>, Vec<Envelope>) =
            envelopes.into_iter().partition(|e| e.unique.is_some());
        if !plain.is_empty() {
            let rows = queue_core::sql::encoded(plain, self.options.max_payload_bytes)?;
            self.insert_keyed(conn, &rows).await.backend()?;
        }
        let mut published = Published::all_stored();
        let mut keys = MySqlKeys { t: self, conn };
        for env in &unique {
            if let Some(dup) = publish_unique(&mut keys, env).await? {
                published.duplicates.push(dup);
            }
        }
        Ok(published)
    }

    /// [`publish_with_keys`](Self::publish_with_keys) in a transaction of its own, run
    /// again when it loses a deadlock.
    pub(super) async fn insert_unique_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        let mut tries = 0;
        let published = loop {
            tries += 1;
            let attempt = async {
                let mut tx = self.pool.begin().await.backend()?;
                let published = self.publish_with_keys(&mut tx, envelopes.clone()).await?;
                tx.commit().await.backend()?;
                Ok::<_, queue_core::Error>(published)
            };
            match attempt.await {
                Err(err) if err.is_transient() && tries < DEADLOCK_TRIES => {
                    self.lock_retries.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %err, "a publish with unique keys runs again");
                }
                other => break other?,
            }
        };
        for env in &envelopes {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
        Ok(published)
    }

    /// Holds acked jobs' keys for their `done` periods (see [`HOLD_KEY`]).
    pub(super) async fn hold_done_keys(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            let token = hold.token.to_string();
            self.retrying("hold a unique key", || {
                sqlx::query(&self.keys.hold_key)
                    .bind(hold.period_us)
                    .bind(&hold.queue)
                    .bind(&hold.key)
                    .bind(&hold.id)
                    .bind(&hold.id)
                    .bind(&token)
                    .execute(&self.pool)
            })
            .await?;
        }
        Ok(())
    }
}
