//! An operator's controls over running work, kept in the SQL store beside the jobs (the
//! status store; RabbitMQ's control store) and seen by every worker within a poll:
//! paused queues and kinds, and cancellations.

use std::fmt;

use async_trait::async_trait;
use serde::Serialize;
use uuid::Uuid;

use crate::error::Result;

/// A paused queue, or one paused kind of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Paused {
    /// The queue.
    pub queue: String,
    /// The kind, or `None` when the whole queue is paused.
    pub kind: Option<String>,
}

/// Paused queues and cancelled jobs (see the module documentation).
#[async_trait]
pub trait Controls: Send + Sync + fmt::Debug {
    /// Pauses `queue` (every kind, or only `kind`): no worker starts its jobs until it
    /// is resumed. Pausing twice is one pause.
    async fn pause(&self, queue: &str, kind: Option<&str>) -> Result<()>;

    /// Resumes what [`pause`](Self::pause) paused; whether it was paused.
    async fn resume(&self, queue: &str, kind: Option<&str>) -> Result<bool>;

    /// Everything paused.
    async fn paused(&self) -> Result<Vec<Paused>>;

    /// Marks `ids` cancelled: a worker that has not started one never runs it, and one
    /// running it cancels its handler; either ends the job `cancelled`. A job whose
    /// status says it completed or died is not cancelled: its mark is taken for one
    /// left from that run and forgotten when the job runs again.
    async fn cancel(&self, ids: &[Uuid]) -> Result<()>;

    /// The jobs marked cancelled and not ended yet (100,000 at most).
    async fn cancelled(&self) -> Result<Vec<Uuid>>;

    /// How many jobs are marked, and when the newest mark was made (µs): a reader that
    /// saw the same reads the marks again only when these change.
    async fn marks(&self) -> Result<(u64, i64)>;

    /// Whether job `id` is marked now, read from the store: a worker's view may be a
    /// poll old.
    async fn is_marked(&self, id: Uuid) -> Result<bool> {
        Ok(self.cancelled().await?.contains(&id))
    }

    /// Forgets the marks of `ids` (their jobs ended cancelled).
    async fn forget(&self, ids: &[Uuid]) -> Result<()>;
}
