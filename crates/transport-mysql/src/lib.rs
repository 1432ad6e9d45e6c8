//! MySQL 8 / MariaDB 10.6+ transport for switchyard: claims with `FOR UPDATE SKIP LOCKED`
//! (or an optimistic compare-and-set), deadlocks and lock-wait timeouts retried
//! transparently, batched publish/ack, and publishing inside the caller's own
//! transaction (the transactional outbox).
//!
//! Not meant for direct use: enable the `mysql` feature of the `switchyard` crate, which
//! re-exports [`MySqlTransport`] and [`MySqlOptions`].
//!
#![doc = include_str!("../README.md")]

mod broker_keys;
mod connect;
mod cursor;
mod error;
mod inbox;
mod limits;
mod migrate;
mod options;
mod runner;
mod server;
mod sql;
mod status;
mod tenants;
mod transport;
mod unique_sql;
mod watch;

pub use inbox::MySqlInbox;
pub use options::MySqlOptions;
pub use server::ServerInfo;
pub use sqlx;
pub use status::MySqlStatusStore;
pub use tenants::databases_with_table;
pub use transport::MySqlTransport;
