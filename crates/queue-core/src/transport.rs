use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::capabilities::Capabilities;
use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::names::QueueName;

/// The token of one lease: ack, release, dead-letter and extend must present it, so a
/// worker whose lease was lost cannot touch the message again (fencing). A handler can
/// also guard its own downstream writes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct LeaseToken(pub Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn generate() -> Self {
        LeaseToken(Uuid::new_v4())
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The opaque proof of a reservation that a transport hands out and takes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    message_id: Uuid,
    token: LeaseToken,
    tag: u64,
    origin: u8,
}

impl Receipt {
    /// A receipt for `message_id` under `token`; `tag` is for the transport's own use
    /// (an AMQP delivery tag, a row number), 0 when unused.
    pub fn new(message_id: Uuid, token: LeaseToken, tag: u64) -> Self {
        Receipt {
            message_id,
            token,
            tag,
            origin: 0,
        }
    }

    /// Which of a router's backends handed the reservation out (0 for a plain
    /// transport): set by a router, ignored by the transports themselves.
    pub fn origin(&self) -> u8 {
        self.origin
    }

    /// The receipt marked as handed out by a router's backend `origin`.
    pub fn with_origin(mut self, origin: u8) -> Self {
        self.origin = origin;
        self
    }

    /// The reserved message's id.
    pub fn message_id(&self) -> Uuid {
        self.message_id
    }

    /// The lease token.
    pub fn token(&self) -> LeaseToken {
        self.token
    }

    /// The transport's own tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }
}

/// A reserved message: the envelope and the receipt that proves the lease.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The message, with `attempts` counting the deliveries that ended without an ack.
    pub envelope: Envelope,
    /// The lease proof.
    pub receipt: Receipt,
}

impl Reservation {
    /// The message id.
    pub fn id(&self) -> Uuid {
        self.receipt.message_id
    }

    /// The lease token.
    pub fn token(&self) -> LeaseToken {
        self.receipt.token
    }
}

/// The outcome of [`Transport::ack_batch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckReport {
    /// Messages removed.
    pub acked: Vec<Uuid>,
    /// Messages whose lease was lost; they were not touched.
    pub lost: Vec<Uuid>,
}

/// Counts for one queue, as of the store's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Due and not leased (including messages whose lease expired).
    pub ready: u64,
    /// Not yet due.
    pub delayed: u64,
    /// Leased by a worker.
    pub reserved: u64,
    /// In the dead-letter store.
    pub dead: u64,
    /// Age of the oldest ready message, where the backend can tell.
    #[serde(with = "opt_secs")]
    pub oldest_ready_age: Option<Duration>,
}

impl QueueStats {
    /// Empty counts for `queue`.
    pub fn new(queue: impl Into<String>) -> Self {
        QueueStats {
            queue: queue.into(),
            ..QueueStats::default()
        }
    }
}

mod opt_secs {
    use std::time::Duration;

    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

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

/// A durable message store with leases: the one trait every backend implements.
///
/// Every implementation keeps the rules of the contract, which the conformance suite
/// checks: leases (not locks) that expire and count an attempt when reclaimed; fencing by
/// lease token; the store's clock for every time comparison; at most the returned rows
/// claimed per reserve; undecodable rows quarantined with reason `malformed`.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug {
    /// Short backend name for logs and errors (`sqlite`).
    fn name(&self) -> &'static str;

    /// What this backend can promise.
    fn capabilities(&self) -> Capabilities;

    /// The lease a reservation holds; the worker's heartbeat extends by this much every
    /// third of it.
    fn visibility_timeout(&self) -> Duration {
        crate::DEFAULT_VISIBILITY_TIMEOUT
    }

    /// A signal that fires when a message may have arrived on `queue`, where the backend
    /// can tell (in-process publishes, PostgreSQL `LISTEN`). A hint only: polling stays
    /// the truth.
    fn waker(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        let _ = queue;
        None
    }

    /// Stores one message.
    ///
    /// # Behavior
    /// Publishing an id that is already stored stores nothing new and is not an error.
    async fn publish(&self, envelope: Envelope) -> Result<()> {
        self.publish_batch(vec![envelope]).await
    }

    /// Stores several messages, atomically where the backend can.
    ///
    /// # Behavior
    /// Validates every envelope (size) before storing any.
    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<()>;

    /// Reserves the next due message of `queue`, or returns `None` at once when there is
    /// none.
    async fn reserve(&self, queue: &QueueName) -> Result<Option<Reservation>> {
        Ok(self.reserve_batch(queue, 1).await?.into_iter().next())
    }

    /// Reserves up to `max` due messages of `queue`, highest priority first, then in
    /// publish order.
    ///
    /// # Behavior
    /// Claims exactly the messages it returns. Never waits for messages to arrive.
    /// Undecodable rows met on the way are moved to the dead-letter store with reason
    /// `malformed` and are not returned.
    async fn reserve_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>>;

    /// Claims up to `max` messages like [`reserve_batch`](Transport::reserve_batch), but
    /// only ahead of use: until [`start_batch`](Transport::start_batch) marks them, a
    /// lapsed lease on them counts no attempt. Workers use it to prefetch. By default the
    /// same as `reserve_batch`.
    async fn prefetch_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.reserve_batch(queue, max).await
    }

    /// Claims up to `max` messages for a worker whose handlers keep up: like
    /// [`prefetch_batch`](Transport::prefetch_batch), except that messages that never
    /// ended a delivery unacknowledged (`attempts` 0) are marked started in the same
    /// statement, which saves the worker a round trip per batch. Returns each reservation
    /// with whether it was started; the worker starts the others (possible poison) alone.
    /// By default `prefetch_batch`, with none started.
    async fn prefetch_batch_starting_fresh(
        &self,
        queue: &QueueName,
        max: usize,
    ) -> Result<Vec<(Reservation, bool)>> {
        Ok(self
            .prefetch_batch(queue, max)
            .await?
            .into_iter()
            .map(|r| (r, false))
            .collect())
    }

    /// Removes a processed message.
    ///
    /// # Behavior
    /// Fails with [`Error::LeaseLost`] and changes nothing when the lease was lost.
    async fn ack(&self, reservation: &Reservation) -> Result<()> {
        let report = self.ack_batch(std::slice::from_ref(reservation)).await?;
        if report.lost.is_empty() {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                message_id: reservation.id(),
            })
        }
    }

    /// Removes several processed messages in one round trip.
    ///
    /// # Behavior
    /// Messages whose lease was lost are reported in [`AckReport::lost`] and untouched.
    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport>;

    /// Gives a message back for a later retry: `attempts + 1`, due after `delay`,
    /// `last_error` set to `error` when given.
    async fn release(
        &self,
        reservation: &Reservation,
        delay: Duration,
        error: Option<&str>,
    ) -> Result<()>;

    /// Tells the backend that handlers are about to start these messages, and renews their
    /// leases. From then on a lapsed lease counts an attempt; before, it does not, so
    /// messages a worker claimed ahead and never started are not charged when the worker
    /// dies. Messages whose lease was lost are reported in [`AckReport::lost`] (read
    /// "acked" as "started") and must not be started.
    ///
    /// By default a no-op that reports every message started (backends that count
    /// every delivery).
    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        Ok(AckReport {
            acked: reservations.iter().map(Reservation::id).collect(),
            lost: Vec::new(),
        })
    }

    /// Gives back a message that was reserved but never handed to a handler (a worker's
    /// prefetch at shutdown): due at once and, where the backend can tell, without
    /// counting an attempt. By default the same as `release` with no delay.
    async fn abandon(&self, reservation: &Reservation) -> Result<()> {
        self.release(reservation, Duration::ZERO, None).await
    }

    /// Moves a message to the dead-letter store with `reason`, atomically.
    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()>;

    /// Renews the lease for `lease` from now (heartbeat of a long job).
    async fn extend(&self, reservation: &Reservation, lease: Duration) -> Result<()>;

    /// Counts per queue (one queue when given).
    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>>;

    /// The store of job status and results beside this transport's messages (a table
    /// next to the queue table), or `None` where the backend keeps none (RabbitMQ).
    fn status_store(&self) -> Option<Arc<dyn crate::status::StatusStore>> {
        None
    }

    /// Claims up to `max` messages of `queue` that no worker holds, due or not, for a
    /// move to another backend (`switchyard move`): leased like reservations and not
    /// started, so that an ack removes them once they are stored elsewhere, and a mover
    /// that dies gives them back when the lease runs out (at their due time if that is
    /// later). By default only what is due (`prefetch_batch`): RabbitMQ cannot take a
    /// message out of its delay chain early.
    async fn claim_for_move(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.prefetch_batch(queue, max).await
    }

    /// Stores dead letters moved from another backend as they are (id, reason, last
    /// error, attempts, time of death, envelope or raw text); how many were stored.
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        let _ = letters;
        Err(Error::InvalidInput(format!(
            "the {} transport cannot take dead letters from another backend",
            self.name()
        )))
    }

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
}
