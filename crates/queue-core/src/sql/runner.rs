//! The smallest thing a SQL backend runs for a store written once in this crate: a
//! statement with text and integer parameters, and rows of text and integer columns.
//! A backend implements it over its pool in a few lines; the store's logic stays here.

use std::fmt;

use async_trait::async_trait;

use crate::error::{Error, Result};

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub enum Bind<'a> {
    /// Text.
    Text(&'a str),
    /// A 64-bit integer.
    Int(i64),
}

/// The type a column is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text.
    Text,
    /// A 64-bit integer (BIGINT, SQLite's INTEGER).
    Int,
}

/// A column value as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A 64-bit integer.
    Int(i64),
}

impl Cell {
    /// The text of a text column.
    pub fn text(self, column: &str) -> Result<String> {
        match self {
            Cell::Text(t) => Ok(t),
            Cell::Int(_) => Err(Error::Conflict(format!(
                "column {column} holds an integer where text was expected: a table of another schema"
            ))),
        }
    }

    /// The value of an integer column.
    pub fn int(&self, column: &str) -> Result<i64> {
        match self {
            Cell::Int(n) => Ok(*n),
            Cell::Text(_) => Err(Error::Conflict(format!(
                "column {column} holds text where an integer was expected: a table of another schema"
            ))),
        }
    }
}

/// Runs statements on a backend's pool.
#[async_trait]
pub trait SqlRunner: Send + Sync + fmt::Debug + 'static {
    /// Runs `sql` with `binds`; the rows it changed.
    async fn execute(&self, sql: &str, binds: &[Bind<'_>]) -> Result<u64>;

    /// Runs `sql` with `binds`; each row's columns read as `columns` say.
    async fn fetch(
        &self,
        sql: &str,
        binds: &[Bind<'_>],
        columns: &[Kind],
    ) -> Result<Vec<Vec<Cell>>>;
}

/// Implements [`SqlRunner`] for a newtype `$runner` over a sqlx pool, in a transport
/// crate (which has sqlx, async-trait and its own `crate::error::SqlxResultExt`): one
/// body for every backend. `binary_text` reads text columns as bytes, for MySQL's
/// `utf8mb4_bin` columns, which come back as binary.
// `crate::error` is meant: each transport maps sqlx's errors its own way.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! sql_runner {
    ($runner:ident, $pool:ty, $db:ty) => {
        $crate::sql_runner!(@impl $runner, $pool, $db, |row: &<$db as sqlx::Database>::Row, i| {
            sqlx::Row::try_get::<String, _>(row, i)
        });
    };
    ($runner:ident, $pool:ty, $db:ty, binary_text) => {
        $crate::sql_runner!(@impl $runner, $pool, $db, |row: &<$db as sqlx::Database>::Row, i| {
            sqlx::Row::try_get::<Vec<u8>, _>(row, i)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        });
    };
    (@impl $runner:ident, $pool:ty, $db:ty, $text:expr) => {
        /// Runs the statements of the stores written once in queue-core on the pool.
        #[derive(Debug, Clone)]
        pub(crate) struct $runner(pub(crate) $pool);

        impl $runner {
            fn query<'q>(
                sql: &'q str,
                binds: &[$crate::sql::runner::Bind<'q>],
            ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
                binds.iter().fold(sqlx::query(sql), |q, b| match *b {
                    $crate::sql::runner::Bind::Text(t) => q.bind(t),
                    $crate::sql::runner::Bind::Int(n) => q.bind(n),
                })
            }
        }

        #[async_trait::async_trait]
        impl $crate::sql::runner::SqlRunner for $runner {
            async fn execute(
                &self,
                sql: &str,
                binds: &[$crate::sql::runner::Bind<'_>],
            ) -> $crate::Result<u64> {
                use crate::error::SqlxResultExt as _;
                let done = Self::query(sql, binds).execute(&self.0).await.backend()?;
                Ok(done.rows_affected())
            }

            async fn fetch(
                &self,
                sql: &str,
                binds: &[$crate::sql::runner::Bind<'_>],
                columns: &[$crate::sql::runner::Kind],
            ) -> $crate::Result<Vec<Vec<$crate::sql::runner::Cell>>> {
                use crate::error::SqlxResultExt as _;
                let rows = Self::query(sql, binds).fetch_all(&self.0).await.backend()?;
                rows.iter()
                    .map(|row| {
                        columns
                            .iter()
                            .enumerate()
                            .map(|(i, kind)| match kind {
                                $crate::sql::runner::Kind::Text => {
                                    ($text)(row, i).map($crate::sql::runner::Cell::Text)
                                }
                                $crate::sql::runner::Kind::Int => sqlx::Row::try_get::<i64, _>(row, i)
                                    .map($crate::sql::runner::Cell::Int),
                            })
                            .collect::<std::result::Result<Vec<_>, _>>()
                            .backend()
                    })
                    .collect()
            }
        }
    };
}
