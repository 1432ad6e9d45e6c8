//! The dead-letter store: what is in it, and the trait to list, replay, purge and fill it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::names::QueueName;

/// One message in the dead-letter store.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message id as stored (a row that could not be decoded may carry any text).
    pub id: String,
    /// The queue it was on.
    pub queue: String,
    /// Its kind, where known.
    pub kind: String,
    /// Why it is here (`malformed`, `expired`, `max_attempts`, …).
    pub reason: String,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// Deliveries that ended without an ack.
    pub attempts: u32,
    /// When it was dead-lettered (store clock).
    pub dead_at: DateTime<Utc>,
    /// The decoded message, or `None` for a malformed one.
    #[serde(skip)]
    pub envelope: Option<Envelope>,
    /// The stored text, kept for a malformed message so nothing is lost.
    pub raw: Option<String>,
    /// The message's ordering key: its dead-lettering handed the key on, so later
    /// messages of the key went ahead of it (a replay puts it behind them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
}

impl DeadLetter {
    /// A dead letter; fields beyond these start empty.
    pub fn new(
        id: impl Into<String>,
        queue: impl Into<String>,
        reason: impl Into<String>,
        dead_at: DateTime<Utc>,
    ) -> Self {
        DeadLetter {
            id: id.into(),
            queue: queue.into(),
            kind: String::new(),
            reason: reason.into(),
            last_error: None,
            attempts: 0,
            dead_at,
            envelope: None,
            raw: None,
            ordering_key: None,
        }
    }
}

/// Which dead letters a replay or purge acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadSelection {
    /// The one with this id.
    Id(String),
    /// All of them.
    All,
    /// Those dead-lettered longer ago than this.
    OlderThan(Duration),
}

/// The dead-letter store beside a transport's queues. Every transport has one (it is a
/// supertrait of [`Transport`](crate::Transport)); a backend that cannot do one of these
/// answers [`Error::NotSupported`].
#[async_trait]
pub trait DeadLetters: Send + Sync {
    /// Lists dead letters, oldest first.
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>>;

    /// Puts dead letters back on their queue, due now, with `attempts` reset to 0.
    /// Returns how many moved; [`Error::NotFound`] for an unknown id.
    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64>;

    /// Deletes dead letters. Returns how many; [`Error::NotFound`] for an unknown id.
    async fn dead_purge(&self, queue: Option<&QueueName>, selection: &DeadSelection)
        -> Result<u64>;

    /// Stores dead letters moved from another backend as they are (id, reason, last
    /// error, attempts, time of death, envelope or raw text); how many were stored.
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        let _ = letters;
        Err(Error::NotSupported(
            "this backend cannot take dead letters from another backend".into(),
        ))
    }
}
