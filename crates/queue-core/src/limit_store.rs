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

/// What [`LimitStore::park`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// The job is set aside until a slot frees.
    Parked,
    /// Every slot it wants is free now: it may try again (it is put back briefly).
    Free,
    /// Its message is not in this store's jobs table, or its lease is gone.
    NotHere,
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

    /// [`acquire`](Self::acquire) for each of `batch` (lease, hold, wants), in one
    /// transaction where the store has them: a burst of jobs of one key pays one commit
    /// rather than one each. Each answer is its own; a failure fails them all.
    async fn acquire_batch(
        &self,
        batch: &[(LimitLease<'_>, Duration, &[Want])],
    ) -> Result<Vec<Acquired>>;

    /// Holds `lease`'s slots for `hold` from now; `false` when it holds none any more
    /// (they ran out and another lease took them).
    async fn extend(&self, lease: LimitLease<'_>, hold: Duration) -> Result<bool>;

    /// Frees `lease`'s slots; slots another lease has taken since are left alone. Wakes
    /// as many jobs [`park`](Self::park)ed under those keys as slots are free; how many.
    async fn release(&self, lease: LimitLease<'_>) -> Result<u64>;

    /// Sets aside the job of `lease`, still leased under `job_token` (the transport's
    /// lease token), because a slot of one of `wants`' keys is not free: its message
    /// leaves the claim order until the release of a slot of that key wakes it, or
    /// `backstop` passes. Only a store beside the jobs' own table can
    /// ([`NotHere`](Parked::NotHere) otherwise: the caller puts the job back to wait).
    async fn park(
        &self,
        lease: LimitLease<'_>,
        job_token: &str,
        wants: &[Want],
        backstop: Duration,
    ) -> Result<Parked>;

    /// Wakes the parked jobs of keys with free slots (their holders ran out instead of
    /// releasing them); how many. Workers run it now and then.
    async fn wake_parked(&self) -> Result<u64>;

    /// Each key's slots in use and bucket, keys with slots held or tokens spent first.
    async fn usage(&self) -> Result<Vec<LimitUsage>>;
}
