//! Unique keys on PostgreSQL: the key table's statements, run by the shared algorithm
//! ([`queue_core::sql::unique`]) inside the publish's transaction.

use std::collections::HashSet;

use queue_core::sql::unique::{
    publish_in_order, KeyHold, KeyHolder, KeyRow, KeyStatements, TakeKey,
};

use queue_core::sql::broker_keys::again_while_transient;

use super::*;

/// How many times a publish with unique keys runs again after losing a deadlock: a
/// batch locks the keys it takes at once in the keys' order, but the keys it takes one
/// at a time (see `take_new_keys`) in its own.
const DEADLOCK_TRIES: usize = 5;

/// The statements on one transaction.
struct PgKeys<'a> {
    t: &'a PgTransport,
    conn: &'a mut PgConnection,
}

pub(crate) use crate::unique_sql::KeySql;

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
        let row: Option<(bool, String)> = sqlx::query_as(&self.t.keys.holder)
            .bind(&key.id)
            .fetch_optional(&mut *self.conn)
            .await
            .backend()?;
        Ok(match row {
            None => KeyHolder::Gone,
            Some((true, _)) => KeyHolder::Claimed,
            Some((false, envelope)) => KeyHolder::Waiting(envelope),
        })
    }

    async fn insert_jobs(&mut self, envelopes: Vec<Envelope>) -> Result<()> {
        self.t.store_all_in(self.conn, envelopes).await
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

    async fn ids_stored(&mut self, ids: &[&str]) -> Result<HashSet<String>> {
        let stored: Vec<String> = sqlx::query_scalar(&self.t.keys.ids_stored)
            .bind(ids)
            .fetch_all(&mut *self.conn)
            .await
            .backend()?;
        Ok(stored.into_iter().collect())
    }

    async fn insert_new_keys(&mut self, takes: &[TakeKey<'_>]) -> Result<HashSet<String>> {
        self.t.keys.insert_new_keys(self.conn, takes).await
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
        self.insert_chunks(false, conn, &batch).await.backend()
    }

    /// Stores `envelopes`, some with unique keys, on `conn` (a transaction), in their
    /// order (see [`publish_in_order`]).
    pub(super) async fn publish_with_keys(
        &self,
        conn: &mut PgConnection,
        envelopes: Vec<Envelope>,
    ) -> Result<Published> {
        publish_in_order(&mut PgKeys { t: self, conn }, envelopes).await
    }

    /// [`publish_with_keys`](Self::publish_with_keys) in a transaction of its own, run
    /// again when it loses a deadlock.
    pub(super) async fn insert_unique_batch(&self, envelopes: Vec<Envelope>) -> Result<Published> {
        again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin().await.backend()?;
            let published = self.publish_with_keys(&mut tx, envelopes.clone()).await?;
            tx.commit().await.backend()?;
            Ok(published)
        })
        .await
    }

    /// Deletes up to 1,000 unique-key rows that hold nothing any more (their holds have
    /// run out and their jobs are gone), of keys last taken longer than `older_than`
    /// ago; how many. Claims run it every minute with
    /// [`PRUNE_AFTER`](queue_core::sql::unique::PRUNE_AFTER); a shorter age is for
    /// tests and quiet stores (a key taken over meanwhile could be deleted).
    pub async fn prune_unique_keys(&self, older_than: Duration) -> Result<u64> {
        self.keys.prune(&self.pool, micros(older_than)).await
    }

    /// Holds acked jobs' keys for their `done` periods (fenced by their tokens).
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
