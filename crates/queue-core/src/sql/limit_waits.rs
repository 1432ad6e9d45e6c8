//! Jobs parked by a concurrency limit, in a SQL store beside the jobs: a job that finds
//! every slot of a key taken leaves the claim order (its row made not due, the way a
//! snooze does it) and is named in `<table>_waits`; the release of a slot wakes the
//! key's oldest waiters, as many as slots are free, in the release's own transaction.
//!
//! Parking and waking both run under the key's row lock, so a release that lands while
//! a job parks either is seen by the park (which then does not park) or sees the parked
//! job (and wakes it). A slot whose holder died runs out instead of being released:
//! [`wake_key`], run by workers now and then over the keys with waiters and a free slot,
//! wakes those. A job that takes a slot deletes its waiter row (it may have come back by
//! the backstop); a waiter whose job is gone wakes nothing and is deleted, and the next
//! waiter is woken in its place. A woken job goes back in line as of when it first
//! parked, ahead of the key's jobs that came after it.

use async_trait::async_trait;

use super::limits::{held_before, merged, Bucket, LimitTable};
use crate::error::Result;
use crate::limit::Want;
use crate::limit_store::{LimitLease, Parked};

/// How many rounds of waiters a wake reads at most (each up to the free slots).
const WAKE_ROUNDS: usize = 4;

/// How many waiters a key without a declared concurrency wakes at once.
const UNLIMITED_WAKE: i64 = 64;

/// What a backend runs, besides [`LimitTable`], for parked jobs.
#[async_trait]
pub trait WaitTable: LimitTable {
    /// Makes the job `id`, leased under `job_token`, not due for `backstop_us`, as a
    /// snooze would; `false` when the lease is gone or the job is not in this table.
    async fn park_job(&mut self, id: &str, job_token: &str, backstop_us: i64) -> Result<bool>;

    /// Names the job parked under `key`, keeping the time it first parked.
    async fn wait(&mut self, queue: &str, key: &str, id: &str, now_us: i64) -> Result<()>;

    /// Up to `n` of `key`'s parked jobs, oldest first: id, and when it first parked.
    async fn waiters(&mut self, queue: &str, key: &str, n: i64) -> Result<Vec<(String, i64)>>;

    /// Makes the parked job `id` due now, in line as of `since_us` (a woken job goes
    /// before jobs that came after it); `false` when it is no longer parked.
    async fn wake_job(&mut self, queue: &str, id: &str, since_us: i64) -> Result<bool>;

    /// The keys `lease` holds slots under.
    async fn lease_keys(&mut self, lease: LimitLease<'_>) -> Result<Vec<String>>;

    /// Deletes `lease`'s holder rows.
    async fn release(&mut self, lease: LimitLease<'_>) -> Result<()>;
}

/// Parks the job of `lease` under the first of `wants`' keys whose slots are all taken,
/// or says they are free now (see the module documentation). The caller commits.
pub async fn park<T: WaitTable>(
    t: &mut T,
    lease: LimitLease<'_>,
    job_token: &str,
    wants: &[Want],
    backstop_us: i64,
) -> Result<Parked> {
    for want in merged(wants) {
        let Some(n) = want.concurrency else { continue };
        // A key never taken has no row, and all its slots free.
        let Some(bucket) = t.lock(lease.queue, &want.key).await? else {
            continue;
        };
        let now = bucket.now_us;
        let mine = t.mine(lease.queue, &want.key, lease.id).await?;
        if held_before(mine.as_ref(), lease, now)
            || t.running(lease, &want.key, now).await? >= u64::from(n)
        {
            if !t.park_job(lease.id, job_token, backstop_us).await? {
                return Ok(Parked::NotHere);
            }
            t.wait(lease.queue, &want.key, lease.id, now).await?;
            return Ok(Parked::Parked);
        }
    }
    Ok(Parked::Free)
}

/// Frees `lease`'s slots and wakes as many parked jobs of their keys as are free; how
/// many. The caller commits.
pub async fn release<T: WaitTable>(t: &mut T, lease: LimitLease<'_>) -> Result<u64> {
    let mut keys = t.lease_keys(lease).await?;
    // Keys are locked before the holder rows are deleted, in the one order every
    // transaction takes them (an acquire of the same job's next lease writes its
    // holder row under the key's lock).
    keys.sort();
    keys.dedup();
    let mut locked = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(bucket) = t.lock(lease.queue, &key).await? {
            locked.push((key, bucket));
        }
    }
    WaitTable::release(t, lease).await?;
    let mut woken = 0;
    for (key, bucket) in &locked {
        woken += wake_free(t, lease.queue, key, *bucket).await?;
    }
    Ok(woken)
}

/// Wakes the parked jobs of `queue`'s `key` that its free slots allow; how many. The
/// caller commits.
pub async fn wake_key<T: WaitTable>(t: &mut T, queue: &str, key: &str) -> Result<u64> {
    match t.lock(queue, key).await? {
        Some(bucket) => wake_free(t, queue, key, bucket).await,
        // No row: nothing limits the key any more.
        None => wake(t, queue, key, UNLIMITED_WAKE).await,
    }
}

/// Wakes up to the free slots' number of `key`'s parked jobs, under its lock.
async fn wake_free<T: WaitTable>(t: &mut T, queue: &str, key: &str, bucket: Bucket) -> Result<u64> {
    let free = match bucket.concurrency {
        Some(n) => {
            let nobody = LimitLease {
                queue,
                id: "",
                token: "",
            };
            let running = t.running(nobody, key, bucket.now_us).await?;
            n - i64::try_from(running).unwrap_or(i64::MAX)
        }
        None => UNLIMITED_WAKE,
    };
    if free <= 0 {
        return Ok(0);
    }
    wake(t, queue, key, free).await
}

/// Wakes up to `n` of `key`'s parked jobs, oldest first, skipping waiters that are no
/// longer parked.
async fn wake<T: WaitTable>(t: &mut T, queue: &str, key: &str, n: i64) -> Result<u64> {
    let mut woken = 0u64;
    for _ in 0..WAKE_ROUNDS {
        let left = n - i64::try_from(woken).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        let ids = t.waiters(queue, key, left).await?;
        if ids.is_empty() {
            break;
        }
        for (id, since) in &ids {
            t.unwait(queue, key, id).await?;
            if t.wake_job(queue, id, *since).await? {
                woken += 1;
            }
        }
    }
    Ok(woken)
}
