//! A transport for the worker cases that delegates to a real one, and fails or slows
//! down on demand.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AckReport, Capabilities, Claim, DeadLetter, DeadLetters, DeadSelection, Envelope, Error,
    GiveBack, QueueName, QueueStats, Reservation, Result, Start, Transport,
};

/// Delegates to a real transport, counting ack round trips and, on demand, answering
/// every `extend` with `LeaseLost` (as if another worker had taken the message).
#[derive(Debug)]
pub(super) struct Faulty {
    pub(super) inner: Arc<dyn Transport>,
    pub(super) extend_lost: AtomicBool,
    pub(super) ack_calls: AtomicUsize,
    /// Pretend the backend does not enforce expiry, and hold claims this long before
    /// handing them over, so that they expire in the worker's buffer.
    pub(super) no_expiry_with_slow_claims: Option<Duration>,
    /// Every ack call takes at least this long, as one that waits for a server does: an
    /// AMQP ack waits for no answer, and would often end before the next handler.
    pub(super) slowest_ack: Option<Duration>,
}

impl Faulty {
    pub(super) fn new(inner: Arc<dyn Transport>) -> Self {
        Faulty {
            inner,
            extend_lost: AtomicBool::new(false),
            ack_calls: AtomicUsize::new(0),
            no_expiry_with_slow_claims: None,
            slowest_ack: None,
        }
    }
}

// A forwarding impl: every method is written out, so no default is used by mistake.
#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl Transport for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.no_expiry_with_slow_claims.is_some() {
            caps.expiry = false;
        }
        caps
    }
    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<tokio::sync::Notify>> {
        self.inner.wake_signal(queue)
    }
    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<crate::Published> {
        self.inner.publish_batch(envelopes).await
    }
    async fn claim(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>> {
        if claim.start == Start::All {
            return self.inner.claim(queue, claim).await;
        }
        // Starts nothing in its claims, as a backend without that shortcut: the worker
        // then starts each message itself.
        let claimed = self
            .inner
            .claim(
                queue,
                Claim {
                    start: Start::None,
                    ..claim
                },
            )
            .await?;
        if let (Some(hold), false) = (self.no_expiry_with_slow_claims, claimed.is_empty()) {
            tokio::time::sleep(hold).await;
        }
        Ok(claimed)
    }
    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        self.inner.start_batch(reservations).await
    }
    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        self.ack_calls.fetch_add(1, Ordering::SeqCst);
        let floor = tokio::time::sleep(self.slowest_ack.unwrap_or_default());
        let (acked, ()) = tokio::join!(self.inner.ack_batch(reservations), floor);
        acked
    }
    async fn give_back(&self, r: &Reservation, how: GiveBack<'_>) -> Result<()> {
        self.inner.give_back(r, how).await
    }
    async fn dead_letter(&self, r: &Reservation, why: &str, error: Option<&str>) -> Result<()> {
        self.inner.dead_letter(r, why, error).await
    }
    async fn extend(&self, r: &Reservation, lease: Duration) -> Result<()> {
        if self.extend_lost.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost { message_id: r.id() });
        }
        self.inner.extend(r, lease).await
    }
    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        self.inner.stats(queue).await
    }
    async fn maintain(&self) -> Result<()> {
        self.inner.maintain().await
    }
}

#[async_trait]
impl crate::Holdings for Faulty {
    async fn held(
        &self,
        which: crate::HeldSelection<'_>,
        limit: usize,
    ) -> Result<Vec<crate::Holding>> {
        self.inner.held(which, limit).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl DeadLetters for Faulty {
    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        self.inner.dead_list(queue, limit).await
    }
    async fn dead_replay(&self, queue: Option<&QueueName>, s: &DeadSelection) -> Result<u64> {
        self.inner.dead_replay(queue, s).await
    }
    async fn dead_purge(&self, queue: Option<&QueueName>, s: &DeadSelection) -> Result<u64> {
        self.inner.dead_purge(queue, s).await
    }
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        self.inner.dead_insert(letters).await
    }
}
