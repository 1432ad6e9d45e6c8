//! SQLite transport for switchyard: bundled SQLite in WAL mode, safe for several
//! processes on one database file.
//!
//! Not meant for direct use: enable the `sqlite` feature of the `switchyard` crate, which
//! re-exports [`SqliteTransport`] and [`SqliteOptions`].
//!
#![doc = include_str!("../README.md")]

mod broker_keys;
mod error;
mod inbox;
mod limits;
mod migrate;
mod options;
mod runner;
mod sql;
mod status;
mod tenants;
mod transport;
mod unique_sql;
mod watch;

pub use inbox::SqliteInbox;
pub use options::{SqliteOptions, SqliteSynchronous};
pub use sqlx;
pub use status::SqliteStatusStore;
pub use tenants::holds_table;
pub use transport::SqliteTransport;
