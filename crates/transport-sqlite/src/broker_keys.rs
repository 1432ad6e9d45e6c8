//! The unique keys of RabbitMQ's messages, kept in this database when it is the broker's
//! control store, in the key table ([`queue_core::sql::broker_keys`]); the store is
//! [`queue_core::sql_broker_keys!`].

use std::sync::Arc;

use sqlx::{SqliteConnection, SqlitePool};

use crate::unique_sql::KeySql;

/// A take runs once: the write lock from its first statement (`BEGIN IMMEDIATE`) means
/// publishers of a key never race.
const TAKE_TRIES: usize = 1;

/// The key store of a broker's messages in this database.
#[derive(Debug)]
pub(crate) struct SqliteBrokerKeys {
    /// The write connection.
    pool: SqlitePool,
    sql: Arc<KeySql>,
}

impl SqliteBrokerKeys {
    pub(crate) fn new(pool: SqlitePool, sql: Arc<KeySql>) -> Self {
        SqliteBrokerKeys { pool, sql }
    }
}

queue_core::sql_broker_keys!(
    SqliteBrokerKeys,
    conn: SqliteConnection,
    key_sql: KeySql,
    begin: |pool| pool.begin_with("BEGIN IMMEDIATE"),
    tries: TAKE_TRIES,
    duration_first: false,
    prune: |sql, pool, us| sql.prune(pool, us).await,
);
