//! The worker runtime: reserves in batches, runs handlers concurrently, extends leases
//! of long jobs, retries with backoff, coalesces acks, and shuts down gracefully.
//!
//! How the pieces fit: [`Worker::run`] (`run.rs`) starts the fetcher (`fetch.rs`), which
//! claims batches into a channel; the dispatcher (`dispatch.rs`) takes them off it,
//! marks them started and runs each in its own task (`deliver.rs`), whose acks the
//! acker (`acker.rs`) commits in batches. A limited job takes its slots first
//! (`limits.rs`).

mod acker;
mod builder;
mod checkpoints;
mod control_view;
mod controls;
mod counters;
mod deliver;
mod dispatch;
mod fetch;
mod freshness;
mod handler;
mod limit_turns;
mod limits;
mod options;
mod registration;
mod retry;
mod run;
mod schedules;
mod upkeep;

pub use builder::Worker;
pub use counters::{WorkerCounters, WorkerReport};
pub use handler::{handler_fn, FnHandler, Handler, JobContext, JobError, JobResult};
pub use options::{UnknownKind, WorkerOptions};
pub use retry::RetryPolicy;
