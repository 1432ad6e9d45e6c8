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
