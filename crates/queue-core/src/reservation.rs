//! Leases and the proof of holding one: what a claim hands out and every later call
//! presents.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::envelope::Envelope;

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

/// A reserved message: the envelope, the receipt that proves the lease, how long the
/// lease runs and whether the message is started.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The message, with `attempts` counting the deliveries that ended without an ack.
    pub envelope: Envelope,
    /// The lease proof.
    pub receipt: Receipt,
    /// How long the lease runs from the claim; a heartbeat renews it every third of it.
    pub lease: Duration,
    /// Whether a lapse of the lease counts an attempt: true once the message is started
    /// (by the claim itself or by [`Transport::start_batch`](crate::Transport::start_batch)).
    pub started: bool,
}

impl Reservation {
    /// A reservation of `envelope` under `receipt` for `lease`, started or not.
    pub fn new(envelope: Envelope, receipt: Receipt, lease: Duration, started: bool) -> Self {
        Reservation {
            envelope,
            receipt,
            lease,
            started,
        }
    }

    /// The message id.
    pub fn id(&self) -> Uuid {
        self.receipt.message_id
    }

    /// The lease token.
    pub fn token(&self) -> LeaseToken {
        self.receipt.token
    }
}

/// The outcome of [`Transport::ack_batch`](crate::Transport::ack_batch) and
/// [`Transport::start_batch`](crate::Transport::start_batch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckReport {
    /// Messages removed.
    pub acked: Vec<Uuid>,
    /// Messages whose lease was lost; they were not touched.
    pub lost: Vec<Uuid>,
}
