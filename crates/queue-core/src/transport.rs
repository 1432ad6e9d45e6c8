//! The [`Transport`] trait every backend implements, and what its claim and give-back take.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::Notify;

use crate::capabilities::Capabilities;
use crate::dead_letters::DeadLetters;
use crate::envelope::Envelope;
use crate::error::Result;
use crate::holdings::Holdings;
use crate::names::QueueName;
use crate::published::Published;
use crate::reservation::{AckReport, Reservation};

/// What a [`Transport::claim`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim<'a> {
    /// At most this many messages.
    pub max: usize,
    /// Which claimed messages are started at once.
    pub start: Start,
    /// Which messages may be claimed.
    pub scope: Scope,
    /// Who claims, recorded with each claimed message where the backend keeps it
    /// ([`Capabilities::holders`]): by default this process (`host:pid`).
    pub holder: &'a str,
    /// Only messages carrying one of these labels (checked with
    /// [`crate::labels::normalize`]); none: any message. A backend without
    /// [`Capabilities::label_claims`] refuses a filter rather than ignore it.
    pub labels: &'a [String],
}

/// Which messages a claim starts (see [`Transport::start_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Every one: a plain reserve.
    All,
    /// None: a worker's prefetch, started later by `start_batch`.
    None,
    /// Those that never ended a delivery unacknowledged (`attempts` 0), where the
    /// backend can mark them in the claim's own statement; the rest (possible poison)
    /// the worker starts alone.
    Fresh,
}

/// Which messages a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Due messages, highest priority first, then in publish order.
    Due,
    /// Any message no worker holds, due or not, for a move to another backend; where a
    /// backend cannot take a message out of its delay early (RabbitMQ), only due ones.
    Any,
}

impl Claim<'static> {
    /// A plain reserve of up to `max` due messages, each started.
    pub fn reserve(max: usize) -> Self {
        Claim {
            max,
            start: Start::All,
            scope: Scope::Due,
            holder: crate::registry::process_holder(),
            labels: &[],
        }
    }

    /// A worker's prefetch: up to `max` due messages, none started.
    pub fn prefetch(max: usize) -> Self {
        Claim {
            start: Start::None,
            ..Claim::reserve(max)
        }
    }

    /// A prefetch that starts the fresh messages in the claim itself.
    pub fn prefetch_starting_fresh(max: usize) -> Self {
        Claim {
            start: Start::Fresh,
            ..Claim::reserve(max)
        }
    }

    /// Up to `max` messages for a move, due or not, none started: an ack removes them
    /// once stored elsewhere, and a mover that dies gives them back when the lease runs
    /// out (at their due time if that is later).
    pub fn for_move(max: usize) -> Self {
        Claim {
            start: Start::None,
            scope: Scope::Any,
            ..Claim::reserve(max)
        }
    }
}

impl<'a> Claim<'a> {
    /// The same claim, of at most `max` messages.
    pub fn with_max(self, max: usize) -> Self {
        Claim { max, ..self }
    }

    /// The same claim, recorded as held by `holder`.
    pub fn by(self, holder: &'a str) -> Self {
        Claim { holder, ..self }
    }

    /// The same claim, of messages carrying one of `labels` only.
    pub fn with_labels(self, labels: &'a [String]) -> Self {
        Claim { labels, ..self }
    }
}

/// How a message goes back to its queue ([`Transport::give_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack<'a> {
    /// For a retry: `attempts + 1`, due after `delay`, `last_error` set when given.
    Retry {
        /// How long until it is due again.
        delay: Duration,
        /// The failure, kept as the message's last error.
        error: Option<&'a str>,
    },
    /// The handler asked to wait (a snooze, a rate limit): due after `delay`, without
    /// counting an attempt; the last error is kept.
    Snooze {
        /// How long until it is due again.
        delay: Duration,
    },
    /// Never handed to a handler (a prefetch at shutdown): due at once and, where the
    /// backend can tell, without counting an attempt.
    Unstarted,
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

/// A durable message store with leases: the one trait every backend implements.
/// Conveniences (`publish`, `reserve`, `ack`, `release`, …) live in
/// [`TransportExt`](crate::TransportExt), which backends never implement.
///
/// Every implementation keeps the rules of the contract, which the conformance suite
/// checks: leases (not locks) that expire and count an attempt when reclaimed, if the
/// message was started; fencing by lease token; the store's clock for every time
/// comparison; exactly the returned messages claimed; undecodable rows quarantined with
/// reason `malformed`.
#[async_trait]
pub trait Transport: DeadLetters + Holdings + Send + Sync + fmt::Debug {
    /// Short backend name for logs and errors (`sqlite`).
    fn name(&self) -> &'static str;

    /// What this backend can promise.
    fn capabilities(&self) -> Capabilities;

    /// A signal that fires when a message may have arrived on `queue`, where the backend
    /// can tell ([`Capabilities::wake_signal`] says which publishes it covers). A hint
    /// only: polling stays the truth.
    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        let _ = queue;
        None
    }

    /// Stores messages, atomically where the backend can. Validates every envelope
    /// (size) before storing any; an id that is already stored stores nothing new and is
    /// not an error. A message whose unique key another job holds is not stored (or
    /// debounces that job): the outcome lists it with the holder's id.
    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<Published>;

    /// Claims up to `claim.max` messages of `queue`, highest priority first, then in
    /// publish order; each [`Reservation`] says whether it is started. Claims exactly
    /// what it returns and never waits for messages to arrive. Undecodable rows met on
    /// the way are dead-lettered with reason `malformed` and not returned.
    async fn claim(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>>;

    /// Marks messages started, just before their handlers run, and renews their leases:
    /// from then on a lapsed lease counts an attempt. Those whose lease was lost are in
    /// [`AckReport::lost`] and must not be started. By default every message is
    /// reported started (for backends that count every delivery).
    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        Ok(AckReport {
            acked: reservations.iter().map(Reservation::id).collect(),
            lost: Vec::new(),
        })
    }

    /// Removes processed messages in one round trip; those whose lease was lost are in
    /// [`AckReport::lost`] and untouched.
    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport>;

    /// Puts a message back on its queue, for a retry or unstarted.
    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()>;

    /// Moves a message to the dead-letter store with `reason`, atomically.
    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()>;

    /// Renews the lease for `lease` from now (the heartbeat of a long job).
    async fn extend(&self, reservation: &Reservation, lease: Duration) -> Result<()>;

    /// Counts per queue (one queue when given).
    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>>;

    /// Does the transport's upkeep where it is due ([`Capabilities::upkeep`]). A worker
    /// calls it about once a second, in the background; while one does, the transport's
    /// claims leave the upkeep to it instead of running it first. By default there is
    /// none: a wrapper around another transport forwards it.
    async fn maintain(&self) -> Result<()> {
        Ok(())
    }
}
