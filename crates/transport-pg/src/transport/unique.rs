//! Unique keys on PostgreSQL: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction.

use queue_core::sql::unique::{publish_unique, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey};

use super::*;

/// How many times a publish with unique keys runs again after losing a deadlock (two
/// batches taking the same keys in different orders).
const DEADLOCK_TRIES: usize = 5;

/// Whether a job with the id is stored, live or dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs\" WHERE id = $1)
    OR EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = $1)";

/// The key's row, locked: its job, scope, whether its hold lasts, and its age in µs.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > now(), false),
       floor(extract(epoch FROM now() - first_at) * 1000000)::bigint
  FROM \"switchyard_jobs_unique\" WHERE queue = $1 AND unique_key = $2 FOR UPDATE";

/// Creates a key's row; nothing when another transaction created it first.
const INSERT_KEY: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at)
    VALUES ($1, $2, $3, $4, now() + $5 {US}, now())
    ON CONFLICT (queue, unique_key) DO NOTHING";

/// Points a key's row at a new job.
const MOVE_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET id = $3, scope = $4, hold_until = now() + $5 {US}, first_at = now()
 WHERE queue = $1 AND unique_key = $2";

/// The state of a key's job: claimed or not, and its envelope.
const HOLDER: &str = "SELECT token IS NOT NULL, envelope FROM \"switchyard_jobs\" WHERE id = $1";

/// Debounces a job no worker has claimed: its new envelope, due $3 µs from now (out of
/// the claim index until then, as a delayed publish).
const REPLACE_JOB: &str = "UPDATE \"switchyard_jobs\"
   SET envelope = $2, available_at = now() + $3 {US}, visible_at = now() + $3 {US},
       ready = ($3 <= 0)
 WHERE id = $1 AND token IS NULL";

/// Holds an acked job's key for its `done` period, while the job is still held under
/// its token.
const HOLD_KEY: &str = "UPDATE \"switchyard_jobs_unique\" u SET hold_until = now() + $4 {US}
 WHERE u.queue = $1 AND u.unique_key = $2 AND u.id = $3
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = $3 AND j.token = $5)";

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
struct PgKeys<'a> {
    t: &'a PgTransport,
    conn: &'a mut PgConnection,
}

#[async_trait]
impl KeyStatements for PgKeys<'_> {
    async fn id_stored(&mut self, id: &str) -> Result<bool> {
        sqlx::query_scalar(&self.t.keys.id_stored)
            .bind(id)
            .fetch_one(&mut *self.conn)
            .await
            .backend()
    }

    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>> {
        let row: Option<(String, String, bool, i64)> = sqlx::query_as(&self.t.keys.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us)| KeyRow {
            id,
            scope,
            held,
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
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .execute(&mut *self.conn)
            .await
            .backend()
            .map(|_| ())
    }

    async fn holder(&mut self, id: &str) -> Result<KeyHolder> {
        let row: Option<(bool, String)> = sqlx::query_as(&self.t.keys.holder)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((true, _)) => KeyHolder::Claimed,
            Some((false, envelope)) => KeyHolder::Waiting(envelope),
        })
    }

    async fn insert_job(&mut self, env: &Envelope) -> Result<()> {
        self.t.store_all_in(self.conn, vec![env.clone()]).await
    }

    async fn replace_job(&mut self, id: &str, envelope: &str, due_us: i64) -> Result<bool> {
        let done = sqlx::query(&self.t.keys.replace_job)
            .bind(id)
            .bind(envelope)
            .bind(due_us)
            .execute(&mut *self.conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }
}

impl PgTransport {
    /// Stores `envelopes` on `conn` (a transaction), none of them with a unique key
    /// taken into account: the publish of a batch without unique keys.
    pub(super) async fn store_all_in(
        &self,
        conn: &mut PgConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<()> {
        let batch = self.encode(envelopes)?;
        self.lock_keys(conn, &batch.locks).await.backend()?;
        for chunk in &batch.chunks {
            self.insert_with(false, conn, chunk).await.backend()?;
        }
        Ok(())
    }

    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction): those
    /// without first, as one batch, then each with a key in turn.
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut PgConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        let (unique, plain): (Vec<Envelope>, Vec<Envelope>) =
            envelopes.into_iter().partition(|e| e.unique.is_some());
        if !plain.is_empty() {
            self.store_all_in(conn, plain).await?;
        }
        let mut published = Published::all_stored();
        let mut keys = PgKeys { t: self, conn };
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
        loop {
            tries += 1;
            let attempt = async {
                let mut tx = self.pool.begin().await.backend()?;
                let published = self.publish_with_keys(&mut tx, envelopes.clone()).await?;
                tx.commit().await.backend()?;
                Ok::<_, queue_core::Error>(published)
            };
            match attempt.await {
                Err(err) if err.is_transient() && tries < DEADLOCK_TRIES => {
                    tracing::debug!(error = %err, "a publish with unique keys runs again");
                }
                other => return other,
            }
        }
    }

    /// Holds acked jobs' keys for their `done` periods (see [`HOLD_KEY`]).
    pub(super) async fn hold_done_keys(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            sqlx::query(&self.keys.hold_key)
                .bind(&hold.queue)
                .bind(&hold.key)
                .bind(&hold.id)
                .bind(hold.period_us)
                .bind(hold.token)
                .execute(&self.pool)
                .await
                .backend()?;
        }
        Ok(())
    }

    /// Refuses a caller's transaction that is not READ COMMITTED for a publish that
    /// reads keys (`what`): a snapshot older than a key's lock could miss a message of
    /// the key published meanwhile.
    pub(super) async fn require_read_committed(
        &self,
        conn: &mut PgConnection,
        what: &str,
    ) -> Result<()> {
        let isolation: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(conn)
            .await
            .backend()?;
        if isolation != "read committed" {
            return Err(queue_core::Error::InvalidInput(format!(
                "messages with {what} are published in a READ COMMITTED transaction, not {isolation}: a snapshot older than the key's lock could miss a message of the key published meanwhile"
            )));
        }
        Ok(())
    }
}
