//! The unique keys of a broker's messages in a SQL store ([`UniqueKeyStore`] for every
//! SQL backend), over the few statements a backend runs on its key table.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use super::unique::{held_on_broker_us, KeyHold};
use crate::envelope::Envelope;
use crate::error::Result;
use crate::key_store::UniqueKeyStore;
use crate::published::Duplicate;

/// A write to one broker key row, made only while the row names the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOp {
    /// The broker confirmed the publish: gone after this many µs (its expiry, a week
    /// at most), unless its job ended first.
    Confirm(i64),
    /// The job is gone (its publish failed, or it left its key's scope).
    Free,
    /// The job is about to be acked: gone, its key held this many µs (its `done`
    /// period).
    Hold(i64),
}

/// What a SQL backend runs for a broker's keys.
#[async_trait]
pub trait BrokerKeySql: Send + Sync + fmt::Debug {
    /// Takes the keys of `envelopes` in one transaction
    /// ([`take_broker_keys`](super::unique::take_broker_keys)), each held for `window`
    /// until confirmed.
    async fn take_keys(&self, envelopes: &[Envelope], window: Duration) -> Result<Vec<Duplicate>>;

    /// Runs `op` on the key row of `queue` and `key` if it names the job `id`.
    async fn key_op(&self, op: KeyOp, queue: &str, key: &str, id: &str) -> Result<()>;

    /// Deletes up to 1,000 key rows that hold nothing, of keys taken longer than
    /// `older_than` ago; how many.
    async fn prune_keys(&self, older_than: Duration) -> Result<u64>;
}

#[async_trait]
impl<B: BrokerKeySql> UniqueKeyStore for B {
    async fn take(&self, envelopes: &[Envelope], window: Duration) -> Result<Vec<Duplicate>> {
        self.take_keys(envelopes, window).await
    }

    async fn confirmed(&self, envelopes: &[Envelope]) -> Result<()> {
        for env in envelopes {
            if let (Some(unique), Some(us)) = (&env.unique, held_on_broker_us(env)) {
                let id = env.id.to_string();
                self.key_op(KeyOp::Confirm(us), env.queue.as_str(), &unique.key, &id)
                    .await?;
            }
        }
        Ok(())
    }

    async fn free(&self, envelopes: &[Envelope]) -> Result<()> {
        for env in envelopes {
            if let Some(unique) = &env.unique {
                let id = env.id.to_string();
                self.key_op(KeyOp::Free, env.queue.as_str(), &unique.key, &id)
                    .await?;
            }
        }
        Ok(())
    }

    async fn hold(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            self.key_op(
                KeyOp::Hold(hold.period_us),
                &hold.queue,
                &hold.key,
                &hold.id,
            )
            .await?;
        }
        Ok(())
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        self.prune_keys(older_than).await
    }
}

/// Runs `attempt` (a whole transaction) again while it fails transiently (a lost
/// deadlock, a busy SQLite file), up to `tries` times in all, a little apart.
pub async fn again_while_transient<T, F, Fut>(tries: usize, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut tried = 0;
    loop {
        tried += 1;
        match attempt().await {
            Err(err) if err.is_transient() && tried < tries => {
                tracing::debug!(error = %err, "a transaction runs again");
                // Apart, and a little later each time: SQLite answers a busy file at
                // once when waiting could deadlock, and those who collided would again.
                let ms = 2 * tried as u64 + fastrand::u64(..5 * tried as u64);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            other => return other,
        }
    }
}

/// Implements [`BrokerKeySql`] for `$store` (a struct with `pool: $pool` and `sql:
/// Arc<$key_sql>`, the backend's key statements with `lock_key`, `write_key`, `prune`,
/// `confirm_key`, `free_key` and `hold_broker_key`), in a transport crate (which has
/// sqlx, async-trait and its own `crate::error::SqlxResultExt`):
///
/// - `begin: |pool| …` starts the take's transaction (SQLite: `BEGIN IMMEDIATE`);
/// - `tries` is how many times a take runs in all when it fails transiently;
/// - `duration_first` says whether a key statement's duration parameter comes before
///   the queue, key and id (MySQL's `?` bind in order) or after them (`$4`, `?4`);
/// - `prune: |sql, pool, us| …` prunes keys older than `us` microseconds.
// `crate::error` is meant: each transport maps sqlx's errors its own way.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! sql_broker_keys {
    (
        $store:ident,
        conn: $conn:ty,
        key_sql: $key_sql:ty,
        begin: |$p:ident| $begin:expr,
        tries: $tries:expr,
        duration_first: $first:expr,
        prune: |$ps:ident, $pp:ident, $pus:ident| $prune:expr $(,)?
    ) => {
        /// The key table on one transaction.
        struct Table<'a> {
            sql: &'a $key_sql,
            conn: &'a mut $conn,
        }

        #[async_trait::async_trait]
        impl $crate::sql::unique::KeyTable for Table<'_> {
            async fn lock_key(
                &mut self,
                queue: &str,
                key: &str,
            ) -> $crate::Result<Option<$crate::sql::unique::KeyRow>> {
                self.sql.lock_key(self.conn, queue, key).await
            }

            async fn write_key(
                &mut self,
                take: $crate::sql::unique::TakeKey<'_>,
                move_to: bool,
            ) -> $crate::Result<bool> {
                self.sql.write_key(self.conn, take, move_to).await
            }
        }

        #[async_trait::async_trait]
        impl $crate::sql::broker_keys::BrokerKeySql for $store {
            async fn take_keys(
                &self,
                envelopes: &[$crate::Envelope],
                window: std::time::Duration,
            ) -> $crate::Result<Vec<$crate::Duplicate>> {
                use crate::error::SqlxResultExt as _;
                $crate::sql::broker_keys::again_while_transient($tries, || async {
                    let mut tx = {
                        let $p = &self.pool;
                        $begin
                    }
                    .await
                    .backend()?;
                    let table = Table {
                        sql: &self.sql,
                        conn: &mut tx,
                    };
                    let dups =
                        $crate::sql::unique::take_broker_keys(table, envelopes, window).await?;
                    tx.commit().await.backend()?;
                    Ok(dups)
                })
                .await
            }

            async fn key_op(
                &self,
                op: $crate::sql::broker_keys::KeyOp,
                queue: &str,
                key: &str,
                id: &str,
            ) -> $crate::Result<()> {
                use crate::error::SqlxResultExt as _;
                use $crate::sql::broker_keys::KeyOp;
                let (sql, us) = match op {
                    KeyOp::Confirm(us) => (&self.sql.confirm_key, Some(us)),
                    KeyOp::Free => (&self.sql.free_key, None),
                    KeyOp::Hold(us) => (&self.sql.hold_broker_key, Some(us)),
                };
                let mut query = sqlx::query(sql);
                if $first {
                    if let Some(us) = us {
                        query = query.bind(us);
                    }
                }
                query = query.bind(queue).bind(key).bind(id);
                if !$first {
                    if let Some(us) = us {
                        query = query.bind(us);
                    }
                }
                query.execute(&self.pool).await.backend().map(|_| ())
            }

            async fn prune_keys(&self, older_than: std::time::Duration) -> $crate::Result<u64> {
                let ($ps, $pp, $pus) = (&self.sql, &self.pool, $crate::sql::micros(older_than));
                $prune
            }
        }
    };
}
