//! The consumer inbox: idempotent handling of at-least-once deliveries.
//!
//! Delivery is at least once: a lease that lapses while a handler commits, a worker
//! killed after its work but before its ack, or a broker redelivery all run a message
//! again. A handler whose effects live in a SQL database makes them exactly once by
//! recording the message id in the same transaction as the work:
//!
//! 1. begin a transaction on the application's database;
//! 2. `inbox.claim(&mut tx, message_id)`: `true` the first time this id is claimed
//!    (the handler does its work on `tx`), `false` when a committed transaction already
//!    claimed it (the handler skips the work);
//! 3. commit, then ack.
//!
//! Two deliveries of one message at the same time are serialised by the inbox's primary
//! key: the second claim waits for the first transaction, and returns `false` if it
//! committed or `true` if it rolled back. The inbox is independent of where messages
//! come from: a RabbitMQ consumer keeps its inbox in PostgreSQL as well as a PostgreSQL
//! one. Each SQL backend has one (`PgInbox`, `MySqlInbox`, `SqliteInbox`); ids are kept
//! until `prune` removes those older than the longest redelivery window.

/// The inbox table when none is named.
pub const DEFAULT_TABLE: &str = "switchyard_inbox";
