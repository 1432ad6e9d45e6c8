//! Job status and results: an optional store that records, per message id, where the
//! job is (`pending`, `running`, `completed`, `retrying`, `failed`, `dead`), its
//! attempts, the progress its handler reported, its result and its last error; and
//! request/reply on top of it ([`Jobs::publish_and_wait`]).
//!
//! The SQL transports keep it in a table beside their queue table
//! (each SQL transport's `status_store()`; `switchyard::connect_jobs`). Workers write to it in batches, off the hot path
//! ([`crate::worker::Worker::with_status`]); a job is recorded `completed` only once its
//! ack has committed.

mod fold;
mod follow;
mod jobs;
mod record;
mod store;
mod update;
mod writer;

pub use fold::{fold_updates, supersedes};
pub use follow::next_change;
pub use jobs::{Jobs, WaitError};
pub use record::{JobStatus, RawStatus};
pub use store::{prune_in_slices, StatusStore, Throughput, PRUNE_SLICE};
pub use update::{failed_attempts, StatusUpdate, PAYLOAD_KEPT};
pub use writer::{StatusFlusher, StatusWriter};

pub use crate::history::{Attempt, JobFilter, RawAttempt, StateCount};
pub use crate::job_state::JobState;
pub use crate::registry::{worker_label, WorkerInfo, GONE_AFTER, HEARTBEAT_EVERY};
pub use crate::time_units::micros;
