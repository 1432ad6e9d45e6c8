//! The unique keys of RabbitMQ's messages, kept in this database when it is the broker's
//! control store, in the key table ([`queue_core::sql::broker_keys`]); the store is
//! [`queue_core::sql_broker_keys!`].

use std::sync::Arc;

use sqlx::{PgConnection, PgPool};

use crate::unique_sql::KeySql;

/// How many times a take runs in all when it loses deadlocks.
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
}

queue_core::sql_broker_keys!(
    PgBrokerKeys,
    conn: PgConnection,
    key_sql: KeySql,
    begin: |pool| pool.begin(),
    tries: DEADLOCK_TRIES,
    duration_first: false,
    prune: |sql, pool, us| sql.prune(pool, us).await,
);
