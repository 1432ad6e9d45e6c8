//! The unique keys of RabbitMQ's messages, kept in this database when it is the broker's
//! control store, in the key table ([`queue_core::sql::unique::OnBroker`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::sql::micros;
use queue_core::sql::unique::{
    held_on_broker_us, take_broker_keys, KeyHold, KeyRow, KeyTable, TakeKey,
};
use queue_core::{Duplicate, Envelope, Result, UniqueKeyStore};
use sqlx::{PgConnection, PgPool};

use crate::error::SqlxResultExt;
use crate::unique_sql::KeySql;

/// How many times a take runs again after losing a deadlock.
const DEADLOCK_TRIES: usize = 5;

/// The key store of a broker's messages in this database.
#[derive(Debug)]
pub(crate) struct PgBrokerKeys {
    pool: PgPool,
    sql: Arc<KeySql>,
}

impl PgBrokerKeys {
    pub(crate) fn new(pool: PgPool, sql: Arc<KeySql>) -> Self {
        PgBrokerKeys { pool, sql }
    }

    /// Runs `sql` on each envelope's key row: bound to queue, key and id, then `us`
    /// (µs) when given.
    async fn each_key(
        &self,
        sql: &str,
        envelopes: &[Envelope],
        us: Option<fn(&Envelope) -> Option<i64>>,
    ) -> Result<()> {
        for env in envelopes {
            let Some(unique) = &env.unique else { continue };
            let mut query = sqlx::query(sql)
                .bind(env.queue.as_str())
                .bind(&unique.key)
                .bind(env.id.to_string());
            if let Some(us) = us {
                query = query.bind(us(env));
            }
            query.execute(&self.pool).await.backend()?;
        }
        Ok(())
    }
}

/// The key table on one transaction.
struct Table<'a> {
    sql: &'a KeySql,
    conn: &'a mut PgConnection,
}

#[async_trait]
impl KeyTable for Table<'_> {
    async fn lock_key(&mut self, queue: &str, key: &str) -> Result<Option<KeyRow>> {
        self.sql.lock_key(self.conn, queue, key).await
    }

    async fn write_key(&mut self, take: TakeKey<'_>, move_to: bool) -> Result<bool> {
        self.sql.write_key(self.conn, take, move_to).await
    }
}

#[async_trait]
impl UniqueKeyStore for PgBrokerKeys {
    async fn take(
        &self,
        envelopes: &[Envelope],
        confirm_within: Duration,
    ) -> Result<Vec<Duplicate>> {
        let mut tries = 0;
        loop {
            tries += 1;
            let attempt = async {
                let mut tx = self.pool.begin().await.backend()?;
                let table = Table {
                    sql: &self.sql,
                    conn: &mut tx,
                };
                let dups = take_broker_keys(table, envelopes, confirm_within).await?;
                tx.commit().await.backend()?;
                Ok::<_, queue_core::Error>(dups)
            };
            match attempt.await {
                Err(err) if err.is_transient() && tries < DEADLOCK_TRIES => {}
                other => return other,
            }
        }
    }

    async fn confirmed(&self, envelopes: &[Envelope]) -> Result<()> {
        self.each_key(&self.sql.confirm_key, envelopes, Some(held_on_broker_us))
            .await
    }

    async fn free(&self, envelopes: &[Envelope]) -> Result<()> {
        self.each_key(&self.sql.free_key, envelopes, None).await
    }

    async fn hold(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            sqlx::query(&self.sql.hold_broker_key)
                .bind(&hold.queue)
                .bind(&hold.key)
                .bind(&hold.id)
                .bind(hold.period_us)
                .execute(&self.pool)
                .await
                .backend()?;
        }
        Ok(())
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        self.sql.prune(&self.pool, micros(older_than)).await
    }
}
