//! The unique keys of a broker's messages in a SQL store ([`UniqueKeyStore`] for every
//! SQL backend), over the few statements a backend runs on its key table.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use super::unique::{held_on_broker_us, KeyHold};
use crate::envelope::Envelope;
use crate::error::Result;
use crate::key_store::UniqueKeyStore;
use crate::published::Duplicate;

/// A write to one broker key row, made only while the row names the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOp {
    /// The broker confirmed the publish: gone after this many µs (its expiry, a week
    /// at most), unless its job ended first.
    Confirm(i64),
    /// The job is gone (its publish failed, or it left its key's scope).
    Free,
    /// The job is about to be acked: gone, its key held this many µs (its `done`
    /// period).
    Hold(i64),
}

/// What a SQL backend runs for a broker's keys.
#[async_trait]
pub trait BrokerKeySql: Send + Sync + fmt::Debug {
    /// Takes the keys of `envelopes` in one transaction
    /// ([`take_broker_keys`](super::unique::take_broker_keys)), each held for `window`
    /// until confirmed.
    async fn take_keys(&self, envelopes: &[Envelope], window: Duration) -> Result<Vec<Duplicate>>;

    /// Runs `op` on the key row of `queue` and `key` if it names the job `id`.
    async fn key_op(&self, op: KeyOp, queue: &str, key: &str, id: &str) -> Result<()>;

    /// Deletes up to 1,000 key rows that hold nothing, of keys taken longer than
    /// `older_than` ago; how many.
    async fn prune_keys(&self, older_than: Duration) -> Result<u64>;
}

#[async_trait]
impl<B: BrokerKeySql> UniqueKeyStore for B {
    async fn take(&self, envelopes: &[Envelope], window: Duration) -> Result<Vec<Duplicate>> {
        self.take_keys(envelopes, window).await
    }

    async fn confirmed(&self, envelopes: &[Envelope]) -> Result<()> {
        for env in envelopes {
            if let (Some(unique), Some(us)) = (&env.unique, held_on_broker_us(env)) {
                let id = env.id.to_string();
                self.key_op(KeyOp::Confirm(us), env.queue.as_str(), &unique.key, &id)
                    .await?;
            }
        }
        Ok(())
    }

    async fn free(&self, envelopes: &[Envelope]) -> Result<()> {
        for env in envelopes {
            if let Some(unique) = &env.unique {
                let id = env.id.to_string();
                self.key_op(KeyOp::Free, env.queue.as_str(), &unique.key, &id)
                    .await?;
            }
        }
        Ok(())
    }

    async fn hold(&self, holds: &[KeyHold]) -> Result<()> {
        for hold in holds {
            self.key_op(
                KeyOp::Hold(hold.period_us),
                &hold.queue,
                &hold.key,
                &hold.id,
            )
            .await?;
        }
        Ok(())
    }

    async fn prune(&self, older_than: Duration) -> Result<u64> {
        self.prune_keys(older_than).await
    }
}

/// Runs `attempt` (a whole transaction) again while it fails transiently (a lost
/// deadlock, a busy SQLite file), up to `tries` times in all, a little apart.
pub async fn again_while_transient<T, F, Fut>(tries: usize, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut tried = 0;
    loop {
        tried += 1;
        match attempt().await {
            Err(err) if err.is_transient() && tried < tries => {
                tracing::debug!(error = %err, "a transaction runs again");
                // Apart, and a little later each time: SQLite answers a busy file at
                // once when waiting could deadlock, and those who collided would again.
                let ms = 2 * tried as u64 + fastrand::u64(..5 * tried as u64);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            other => return other,
        }
    }
}
