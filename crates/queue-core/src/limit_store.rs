//! Where limits are kept: slots and buckets shared by every worker that declares the
//! same limits (see [`crate::limit`]).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::limit::{Acquired, LimitUsage, Want};

/// The lease a job's slots belong to: only calls that name it (its token) touch them.
/// The worker draws a fresh token for each run, unique across processes.
#[derive(Debug, Clone, Copy)]
pub struct LimitLease<'a> {
    /// The job's queue.
    pub queue: &'a str,
    /// The job's id.
    pub id: &'a str,
    /// The lease's token.
    pub token: &'a str,
}

/// Slots and token buckets for limits, in a store every worker shares (the SQL store
/// beside the jobs, or RabbitMQ's control store).
#[async_trait]
pub trait LimitStore: Send + Sync + fmt::Debug {
    /// Takes, for `lease`, a slot and a token under each of `wants`' keys, or nothing:
    /// the slots are held for `hold` (the lease's length) unless
    /// [`extend`](Self::extend)ed. A rate that is out of tokens books the job the next
    /// free start, which its next try takes.
    async fn acquire(
        &self,
        lease: LimitLease<'_>,
        hold: Duration,
        wants: &[Want],
    ) -> Result<Acquired>;

    /// Holds `lease`'s slots for `hold` from now; `false` when it holds none any more
    /// (they ran out and another lease took them).
    async fn extend(&self, lease: LimitLease<'_>, hold: Duration) -> Result<bool>;

    /// Frees `lease`'s slots; slots another lease has taken since are left alone.
    async fn release(&self, lease: LimitLease<'_>) -> Result<()>;

    /// Each key's slots in use and bucket, keys with slots held or tokens spent first.
    async fn usage(&self) -> Result<Vec<LimitUsage>>;
}
