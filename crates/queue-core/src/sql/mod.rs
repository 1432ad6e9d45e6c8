//! The SQL engine: one implementation of [`Transport`](crate::Transport) and
//! [`DeadLetters`](crate::DeadLetters) for every SQL backend, over the small set of
//! primitives a backend provides ([`SqlBackend`]); one implementation of
//! [`StatusStore`](crate::status::StatusStore) over [`StatusBackend`]; and the building
//! blocks they share.
//! For transport crates; not semver-stable.

mod backend;
pub mod broker_keys;
pub mod checkpoints;
mod claim;
mod claim_counters;
mod claimed;
mod connections;
pub mod controls;
mod dialect;
mod engine;
mod fence;
pub mod job_logs;
mod limit_tables;
pub mod limit_waits;
pub mod limits;
mod optimistic;
pub mod runner;
pub mod schedules;
mod status;
mod store;
pub mod unique;
mod values;
mod wakers;
pub mod watch_loop;

pub use backend::{DeadRow, EngineState, HeldRow, LeaseOp, PairOp, Replayed, SqlBackend, StatsRow};
pub use claim_counters::{ClaimCounters, ClaimTally};
pub use claimed::{ClaimBy, ClaimedRow, OptimisticSlice, PromotePacer, StartMode};
pub use connections::{KeptConnections, KEPT_CONNECTIONS};
pub use fence::{fenced, pair_report, replay_refused};
pub use status::{
    BucketRow, CountRow, StatusBackend, StatusBatch, StatusQuery, StatusTable, WorkerRow,
};
pub use store::{
    check_existing_version, check_schema_version, created_tables, missing_store, sql_capabilities,
    StoreSettings,
};
pub use values::{
    attempts_u32, dead_row, encoded, labels_column, row_seq, selection_parts, Encoded,
};
pub use wakers::Wakers;

pub use crate::text::lossy;
pub use crate::time_units::{limit, micros, micros_between, time_from_micros};
