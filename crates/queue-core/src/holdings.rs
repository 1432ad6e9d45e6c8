//! Who holds which message: what `stats --held`, `switchyard job` and the dashboard show.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::Result;
use crate::names::QueueName;

/// One message a worker holds under a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holding {
    /// The message id as stored.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Who claimed it: `host:pid`, then `/name` for a named worker.
    pub holder: Option<String>,
    /// When it was claimed (store clock).
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the lease runs out unless renewed (store clock).
    pub lease_until: DateTime<Utc>,
    /// Whether a handler has started it (only then does a lapsed lease count an attempt).
    pub started: bool,
    /// Deliveries so far that ended without an ack.
    pub attempts: u32,
}

impl Holding {
    /// A holding; the fields beyond these start empty.
    pub fn new(
        id: impl Into<String>,
        queue: impl Into<String>,
        lease_until: DateTime<Utc>,
    ) -> Self {
        Holding {
            id: id.into(),
            queue: queue.into(),
            kind: String::new(),
            holder: None,
            claimed_at: None,
            lease_until,
            started: false,
            attempts: 0,
        }
    }
}

/// Which holdings [`Holdings::held`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldSelection<'a> {
    /// Every held message, or those of one queue, longest held first.
    Queue(Option<&'a QueueName>),
    /// The message with this id, if it is held.
    Id(&'a str),
}

/// The messages workers hold now. Every transport has it (a supertrait of
/// [`Transport`](crate::Transport)); one without
/// [`Capabilities::holders`](crate::Capabilities::holders) answers
/// [`Error::NotSupported`](crate::Error::NotSupported).
#[async_trait]
pub trait Holdings: Send + Sync {
    /// Up to `limit` messages held under a lease that has not run out.
    async fn held(&self, which: HeldSelection<'_>, limit: usize) -> Result<Vec<Holding>>;
}
