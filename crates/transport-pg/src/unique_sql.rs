//! The statements of unique keys on PostgreSQL: the key table (beside the queue's), and
//! the job state a key's holder is read from (the job's row). Shared by the transport's own publishes and by the key store this
//! database keeps for RabbitMQ as its control store.

use std::collections::HashSet;

use queue_core::sql::unique::{KeyRow, TakeKey};
use queue_core::Result;
use sqlx::{PgConnection, PgPool};

use crate::error::SqlxResultExt;

/// Whether a job with the id is stored, live or dead.
const ID_STORED: &str = "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs\" WHERE id = $1)
    OR EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = $1)";

/// Which of the ids $1 are stored, live or dead.
const IDS_STORED: &str = "SELECT id FROM \"switchyard_jobs\" WHERE id = ANY($1::text[])
    UNION ALL SELECT id FROM \"switchyard_jobs_dead\" WHERE id = ANY($1::text[])";

/// Creates the rows of keys that have none and locks those that have one, unchanged
/// (`DO UPDATE … WHERE false` locks the row it does not update), in the order of their
/// keys: two batches then wait for each other's keys in one order, never in a cycle.
/// Returns the ids of the jobs whose rows it created.
const INSERT_NEW_KEYS: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at, gone_after)
    SELECT q, k, i, s, now() + h {US}, now(), now() + g {US}
      FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[])
           AS t(q, k, i, s, h, g)
     ORDER BY q COLLATE \"C\", k COLLATE \"C\"
    ON CONFLICT (queue, unique_key) DO UPDATE SET id = EXCLUDED.id WHERE false
    RETURNING id";

/// The key's row, locked: its job, scope, whether its hold lasts, its age in µs, and
/// whether a broker's job counts as gone.
const LOCK_KEY: &str = "SELECT id, scope, COALESCE(hold_until > now(), false),
       floor(extract(epoch FROM now() - first_at) * 1000000)::bigint,
       COALESCE(gone_after <= now(), false)
  FROM \"switchyard_jobs_unique\" WHERE queue = $1 AND unique_key = $2 FOR UPDATE";

/// Creates a key's row; nothing when another transaction created it first.
const INSERT_KEY: &str = "INSERT INTO \"switchyard_jobs_unique\"
    (queue, unique_key, id, scope, hold_until, first_at, gone_after)
    VALUES ($1, $2, $3, $4, now() + $5 {US}, now(), now() + $6 {US})
    ON CONFLICT (queue, unique_key) DO NOTHING";

/// Points a key's row at a new job.
const MOVE_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET id = $3, scope = $4, hold_until = now() + $5 {US}, first_at = now(),
       gone_after = now() + $6 {US}
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
const HOLD_KEY: &str = "UPDATE \"switchyard_jobs_unique\" u
   SET hold_until = GREATEST(u.hold_until, now() + $4 {US})
 WHERE u.queue = $1 AND u.unique_key = $2 AND u.id = $3
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = $3 AND j.token = $5)";

/// A broker's job is about to be acked: gone, its key held for its `done` period.
const HOLD_BROKER_KEY: &str = "UPDATE \"switchyard_jobs_unique\"
   SET hold_until = GREATEST(hold_until, now() + $4 {US}), gone_after = now()
 WHERE queue = $1 AND unique_key = $2 AND id = $3";

/// The broker has the message: gone once it expires, or at the latest after a week ($4
/// µs from now). Only while the publish is unconfirmed: a job that already ended (a
/// fast consumer) stays gone.
const CONFIRM_KEY: &str = "UPDATE \"switchyard_jobs_unique\" SET gone_after = now() + $4 {US}
 WHERE queue = $1 AND unique_key = $2 AND id = $3 AND gone_after > now()";

/// A broker's job is gone (its publish failed, or it left the key's scope): the key is
/// free once a throttle's hold has run out.
const FREE_KEY: &str = "UPDATE \"switchyard_jobs_unique\" SET gone_after = now()
 WHERE queue = $1 AND unique_key = $2 AND id = $3";

/// Up to 1,000 key rows that hold nothing (the hold has run out and the job is gone: a
/// broker's by its `gone_after`, the transport's own by its row), of keys taken more
/// than $1 µs ago, locked; rows a publish holds are skipped. The look for the job is of
/// this statement's snapshot, which may predate a publish that took the row over and has
/// committed since: [`PRUNE_DELETE`], a statement of its own, looks again.
const PRUNE_CANDIDATES: &str = "SELECT u.queue, u.unique_key FROM \"switchyard_jobs_unique\" u
 WHERE {PRUNABLE} LIMIT 1000 FOR UPDATE SKIP LOCKED";

/// Deletes the locked candidates ($2, $3: queues and keys) that still hold nothing.
const PRUNE_DELETE: &str = "DELETE FROM \"switchyard_jobs_unique\" u
 USING UNNEST($2::text[], $3::text[]) AS c(queue, unique_key)
 WHERE u.queue = c.queue AND u.unique_key = c.unique_key AND {PRUNABLE}";

/// Whether the key row `u` holds nothing (see [`PRUNE_CANDIDATES`]).
const PRUNABLE: &str = "u.first_at <= now() - $1 {US}
   AND (u.hold_until IS NULL OR u.hold_until <= now())
   AND CASE WHEN u.gone_after IS NULL
            THEN NOT EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = u.id)
            ELSE u.gone_after <= now() END";

/// The key table's statements, specialised for one table.
#[derive(Debug)]
pub(crate) struct KeySql {
    pub(crate) id_stored: String,
    pub(crate) ids_stored: String,
    insert_new_keys: String,
    lock_key: String,
    insert_key: String,
    move_key: String,
    pub(crate) holder: String,
    pub(crate) replace_job: String,
    pub(crate) hold_key: String,
    pub(crate) hold_broker_key: String,
    pub(crate) confirm_key: String,
    pub(crate) free_key: String,
    prune_candidates: String,
    prune_delete: String,
}

impl KeySql {
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Self {
        let s = |sql: &str| crate::sql::specialise(sql, schema, table);
        KeySql {
            id_stored: s(ID_STORED),
            ids_stored: s(IDS_STORED),
            insert_new_keys: s(INSERT_NEW_KEYS),
            lock_key: s(LOCK_KEY),
            insert_key: s(INSERT_KEY),
            move_key: s(MOVE_KEY),
            holder: s(HOLDER),
            replace_job: s(REPLACE_JOB),
            hold_key: s(HOLD_KEY),
            hold_broker_key: s(HOLD_BROKER_KEY),
            confirm_key: s(CONFIRM_KEY),
            free_key: s(FREE_KEY),
            prune_candidates: s(&PRUNE_CANDIDATES.replace("{PRUNABLE}", PRUNABLE)),
            prune_delete: s(&PRUNE_DELETE.replace("{PRUNABLE}", PRUNABLE)),
        }
    }

    /// The key's row, locked until the transaction ends.
    pub(crate) async fn lock_key(
        &self,
        conn: &mut PgConnection,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRow>> {
        let row: Option<(String, String, bool, i64, bool)> = sqlx::query_as(&self.lock_key)
            .bind(queue)
            .bind(key)
            .fetch_optional(conn)
            .await
            .backend()?;
        Ok(row.map(|(id, scope, held, age_us, gone)| KeyRow {
            id,
            scope,
            held,
            age_us,
            gone,
        }))
    }

    /// Deletes up to 1,000 key rows that hold nothing, of keys taken longer than
    /// `older_than_us` ago; how many.
    pub(crate) async fn prune(&self, pool: &PgPool, older_than_us: i64) -> Result<u64> {
        let mut tx = pool.begin().await.backend()?;
        let rows: Vec<(String, String)> = sqlx::query_as(&self.prune_candidates)
            .bind(older_than_us)
            .fetch_all(&mut *tx)
            .await
            .backend()?;
        if rows.is_empty() {
            return Ok(0);
        }
        let (queues, keys): (Vec<String>, Vec<String>) = rows.into_iter().unzip();
        let deleted = sqlx::query(&self.prune_delete)
            .bind(older_than_us)
            .bind(&queues)
            .bind(&keys)
            .execute(&mut *tx)
            .await
            .backend()?
            .rows_affected();
        tx.commit().await.backend()?;
        Ok(deleted)
    }

    /// Creates the rows of `takes`' keys that have none; the ids of the jobs whose rows
    /// it created.
    pub(crate) async fn insert_new_keys(
        &self,
        conn: &mut PgConnection,
        takes: &[TakeKey<'_>],
    ) -> Result<HashSet<String>> {
        let queues: Vec<&str> = takes.iter().map(|t| t.queue).collect();
        let keys: Vec<&str> = takes.iter().map(|t| t.key).collect();
        let ids: Vec<&str> = takes.iter().map(|t| t.id).collect();
        let scopes: Vec<&str> = takes.iter().map(|t| t.scope).collect();
        let created: Vec<String> = sqlx::query_scalar(&self.insert_new_keys)
            .bind(queues)
            .bind(keys)
            .bind(ids)
            .bind(scopes)
            .bind(takes.iter().map(|t| t.hold_us).collect::<Vec<_>>())
            .bind(takes.iter().map(|t| t.gone_after_us).collect::<Vec<_>>())
            .fetch_all(conn)
            .await
            .backend()?;
        Ok(created.into_iter().collect())
    }

    /// Creates the key's row (`move_to` false) or points it at a new job; whether it
    /// wrote.
    pub(crate) async fn write_key(
        &self,
        conn: &mut PgConnection,
        take: TakeKey<'_>,
        move_to: bool,
    ) -> Result<bool> {
        let sql = if move_to {
            &self.move_key
        } else {
            &self.insert_key
        };
        let done = sqlx::query(sql)
            .bind(take.queue)
            .bind(take.key)
            .bind(take.id)
            .bind(take.scope)
            .bind(take.hold_us)
            .bind(take.gone_after_us)
            .execute(conn)
            .await
            .backend()?;
        Ok(done.rows_affected() == 1)
    }
}
