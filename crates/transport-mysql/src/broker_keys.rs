//! The unique keys of RabbitMQ's messages, kept in this database when it is the broker's
//! control store, in the key table ([`queue_core::sql::broker_keys`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::sql::broker_keys::{again_while_transient, BrokerKeySql, KeyOp};
use queue_core::sql::micros;
use queue_core::sql::unique::{take_broker_keys, KeyRow, KeyTable, TakeKey};
use queue_core::{Duplicate, Envelope, Result};
use sqlx::{MySqlConnection, MySqlPool};

use crate::error::SqlxResultExt;
use crate::unique_sql::KeySql;

/// How many times a take runs in all when it loses deadlocks or lock waits.
const DEADLOCK_TRIES: usize = 5;

/// The key store of a broker's messages in this database.
#[derive(Debug)]
pub(crate) struct MySqlBrokerKeys {
    pool: MySqlPool,
    sql: Arc<KeySql>,
}

impl MySqlBrokerKeys {
    pub(crate) fn new(pool: MySqlPool, sql: Arc<KeySql>) -> Self {
        MySqlBrokerKeys { pool, sql }
    }
}

/// The key table on one transaction.
struct Table<'a> {
    sql: &'a KeySql,
    conn: &'a mut MySqlConnection,
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
impl BrokerKeySql for MySqlBrokerKeys {
    async fn take_keys(&self, envelopes: &[Envelope], window: Duration) -> Result<Vec<Duplicate>> {
        again_while_transient(DEADLOCK_TRIES, || async {
            let mut tx = self.pool.begin().await.backend()?;
            let table = Table {
                sql: &self.sql,
                conn: &mut tx,
            };
            let dups = take_broker_keys(table, envelopes, window).await?;
            tx.commit().await.backend()?;
            Ok(dups)
        })
        .await
    }

    async fn key_op(&self, op: KeyOp, queue: &str, key: &str, id: &str) -> Result<()> {
        let (sql, us) = match op {
            KeyOp::Confirm(us) => (&self.sql.confirm_key, Some(us)),
            KeyOp::Free => (&self.sql.free_key, None),
            KeyOp::Hold(us) => (&self.sql.hold_broker_key, Some(us)),
        };
        // The duration, where the statement has it, comes first (`?` binds in order).
        let mut query = sqlx::query(sql);
        if let Some(us) = us {
            query = query.bind(us);
        }
        let query = query.bind(queue).bind(key).bind(id);
        query.execute(&self.pool).await.backend().map(|_| ())
    }

    async fn prune_keys(&self, older_than: Duration) -> Result<u64> {
        self.sql
            .prune(&self.pool, micros(older_than))
            .await
            .backend()
    }
}
