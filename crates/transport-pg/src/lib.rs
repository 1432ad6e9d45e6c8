//! PostgreSQL transport for switchyard: claims with `FOR UPDATE SKIP LOCKED` (or an
//! optimistic compare-and-set), batched publish/ack, `LISTEN`/`NOTIFY` wake-ups, and
//! publishing inside the caller's own transaction (the transactional outbox).
//!
//! Not meant for direct use: enable the `postgres` feature of the `switchyard` crate,
//! which re-exports [`PgTransport`] and [`PgOptions`]. The outbox API takes
//! [`sqlx::Transaction`]; this crate re-exports the `sqlx` it was built with, so callers
//! can name the exact version.
//!
#![doc = include_str!("../README.md")]

mod broker_keys;
mod connect;
mod error;
mod inbox;
mod limits;
mod listener;
mod migrate;
mod options;
mod read_only;
mod runner;
mod sql;
mod standby;
mod status;
mod tenants;
mod transport;
mod unique_sql;

pub use inbox::PgInbox;
pub use options::PgOptions;
pub use queue_core::sql::ClaimCounters;
pub use sqlx;
pub use status::PgStatusStore;
pub use tenants::schemas_with_table;
pub use transport::PgTransport;
