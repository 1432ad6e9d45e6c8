//! The unique keys of RabbitMQ's messages, kept in this database when it is the broker's
//! control store, in the key table ([`queue_core::sql::broker_keys`]); the store is
//! [`queue_core::sql_broker_keys!`].

use std::sync::Arc;

use sqlx::{MySqlConnection, MySqlPool};

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

queue_core::sql_broker_keys!(
    MySqlBrokerKeys,
    conn: MySqlConnection,
    key_sql: KeySql,
    begin: |pool| pool.begin(),
    tries: DEADLOCK_TRIES,
    duration_first: true,
    prune: |sql, pool, us| {
        use crate::error::SqlxResultExt as _;
        sql.prune(pool, us).await.backend()
    },
);
