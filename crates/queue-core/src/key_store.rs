//! Unique keys kept beside a broker: a broker cannot look up a queued message by key, so
//! a transport over one (RabbitMQ) keeps its messages' keys in the SQL store beside it
//! (the control store, where job status lives): taken before the publish, and freed by
//! the transport when the job leaves the key's scope (its start, ack or dead letter).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::envelope::Envelope;
use crate::error::Result;
use crate::published::Duplicate;
use crate::sql::unique::KeyHold;

/// The unique keys of a broker's messages, in a SQL store (see the module documentation).
#[async_trait]
pub trait UniqueKeyStore: Send + Sync + fmt::Debug {
    /// Before `envelopes` (each with a unique key) are published: takes each free key
    /// for its message, and returns the messages whose key another job holds (not to be
    /// published). A key taken here counts as held for `confirm_within` even if
    /// [`confirmed`](Self::confirmed) never comes (the publisher died).
    async fn take(
        &self,
        envelopes: &[Envelope],
        confirm_within: Duration,
    ) -> Result<Vec<Duplicate>>;

    /// The broker has `envelopes`: their keys are held as long as their jobs (and, for
    /// a message that expires, no longer than its expiry).
    async fn confirmed(&self, envelopes: &[Envelope]) -> Result<()>;

    /// Frees the keys `envelopes`' jobs hold: their publish failed, or their jobs left
    /// the key's scope (started, for `pending`; acked or dead-lettered).
    async fn free(&self, envelopes: &[Envelope]) -> Result<()>;

    /// The jobs of `holds` are about to be acked: each key stays held for its `done`
    /// period, then is free.
    async fn hold(&self, holds: &[KeyHold]) -> Result<()>;

    /// Deletes up to 1,000 key rows that hold nothing any more, of keys last taken
    /// longer than `older_than` ago ([`PRUNE_AFTER`](crate::sql::unique::PRUNE_AFTER)
    /// keeps a key being taken over safe); how many.
    async fn prune(&self, older_than: Duration) -> Result<u64>;
}
