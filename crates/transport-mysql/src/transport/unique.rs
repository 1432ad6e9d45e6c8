//! Unique keys on MySQL: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction.

use std::collections::HashSet;

use queue_core::sql::unique::{
    publish_in_order, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey,
};
use queue_core::Published;

use queue_core::sql::broker_keys::again_while_transient;

use super::*;

/// How many times a publish with unique keys runs again after losing a deadlock or a
/// lock wait: a batch locks the keys it takes at once in the keys' order, but the keys
/// it takes one at a time (see `take_new_keys`) in its own.
const DEADLOCK_TRIES: usize = 5;

pub(crate) use crate::unique_sql::KeySql;

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
        self.t.keys.lock_key(self.conn, queue, key).await
    }

    async fn insert_key(&mut self, take: TakeKey<'_>) -> Result<bool> {
        self.t.keys.write_key(self.conn, take, false).await
    }

    async fn move_key(&mut self, take: TakeKey<'_>) -> Result<()> {
        self.t
            .keys
            .write_key(self.conn, take, true)
            .await
            .map(|_| ())
    }

    async fn holder(&mut self, key: &KeyRow) -> Result<KeyHolder> {
        let row: Option<(i64, Vec<u8>)> = sqlx::query_as(&self.t.keys.holder)
            .bind(&key.id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((claimed, _)) if claimed != 0 => KeyHolder::Claimed,
            Some((_, envelope)) => KeyHolder::Waiting(lossy(envelope)),
        })
    }

    async fn insert_jobs(&mut self, envelopes: Vec<Envelope>) -> Result<()> {
        let rows = queue_core::sql::encoded(envelopes, self.t.options.max_payload_bytes)?;
        self.t.insert_keyed(self.conn, &rows).await.backend()
    }

    async fn ids_stored(&mut self, ids: &[&str]) -> Result<HashSet<String>> {
        self.t.keys.ids_stored(self.conn, ids).await
    }

    async fn insert_new_keys(&mut self, takes: &[TakeKey<'_>]) -> Result<HashSet<String>> {
        self.t.keys.insert_new_keys(self.conn, takes).await
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
    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction), in their
    /// order (see [`publish_in_order`]).
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut MySqlConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        publish_in_order(&mut MySqlKeys { t: self, conn }, envelopes).await
    }

    /// [`publish_with_keys`](Self::publish_with_keys) in a transaction of its own, run
    /// again when it loses a deadlock.
    pub(super) async fn insert_unique_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        let published = again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin().await.backend()?;
            let published = self.publish_with_keys(&mut tx, envelopes.clone()).await?;
            tx.commit().await.backend()?;
            Ok(published)
        })
        .await?;
        for env in &envelopes {
            self.cursors
                .forget_outranked(env.queue.as_str(), -i32::from(env.priority));
        }
        Ok(published)
    }

    /// Deletes up to 1,000 unique-key rows that hold nothing any more (their holds have
    /// run out and their jobs are gone), of keys last taken longer than `older_than`
    /// ago; how many. Claims run it every minute with
    /// [`PRUNE_AFTER`](queue_core::sql::unique::PRUNE_AFTER); a shorter age is for
    /// tests and quiet stores (a key taken over meanwhile could be deleted).
    pub async fn prune_unique_keys(&self, older_than: Duration) -> Result<u64> {
        let us = micros(older_than);
        self.retrying("prune unique keys", || self.keys.prune(&self.pool, us))
            .await
    }

    /// Holds acked jobs' keys for their `done` periods (fenced by their tokens).
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
