//! Putting held deliveries back: a retry or snooze through the delay chain, a keyed
//! head kept in its partition consumer's gate, and the publish-then-ack that replaces a
//! delivery (released, given back, or dead).

use super::*;

impl AmqpTransport {
    /// Puts a held delivery back for `delay`, counting `attempts` more (a retry: 1, a
    /// snooze: 0): through the delay chain, or for a keyed head kept in its gate.
    pub(super) async fn comes_back(
        &self,
        reservation: &Reservation,
        delay: Duration,
        attempts: u32,
        error: Option<&str>,
    ) -> Result<()> {
        if self.consumers.holder(reservation).is_none() {
            return Err(lost(reservation));
        }
        let mut env = reservation.envelope.clone();
        env.attempts += attempts;
        env.available_at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
        if let Some(e) = error {
            // As bounded and NUL-free as on the SQL backends, where the message may move.
            env.last_error = Some(text::error_text(e));
        }
        if let Some(c) = self.gate_of(reservation) {
            // Kept, not published again behind the key's later messages.
            self.retry_in_place(&c, reservation, env, delay);
            return Ok(());
        }
        self.replace(reservation, (env, None, Target::Queue)).await
    }

    /// Keeps the failed keyed head `r` (with `env`, its attempt counted) in its
    /// partition consumer's gate, to go out again after `delay`, and wakes the queue's
    /// workers then.
    pub(super) fn retry_in_place(
        &self,
        c: &QueueConsumer,
        r: &Reservation,
        env: Envelope,
        delay: Duration,
    ) {
        let Some(gate) = &c.gate else { return };
        c.hold(r.receipt.tag(), false);
        let mut again = r.clone();
        again.envelope = env;
        again.started = false;
        gate.retry(again, Instant::now() + delay);
        let wakers = self.connector.wakers().clone();
        let queue = r.envelope.queue.as_str().to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            wakers.wake(&queue);
        });
    }

    /// Puts the held keyed head `r` back in front of its key in `c`'s gate, not started,
    /// and wakes the queue's workers to take it again.
    pub(super) fn put_back(&self, c: &QueueConsumer, gate: &crate::gate::KeyGate, r: &Reservation) {
        c.hold(r.receipt.tag(), false);
        let mut back = r.clone();
        back.started = false;
        gate.put_back(back);
        self.connector.wakers().wake(r.envelope.queue.as_str());
    }

    /// The consumer holding `r`'s delivery, if it is a partition's (a keyed message).
    pub(super) fn gate_of(&self, r: &Reservation) -> Option<Arc<QueueConsumer>> {
        r.envelope.ordering_key.as_ref()?;
        self.consumers.holder(r).filter(|c| c.gate.is_some())
    }

    /// Publishes the message that takes `r`'s place (released, given back, or dead),
    /// waits for the confirm, and only then acks `r`: at worst twice, never lost.
    pub(super) async fn replace(
        &self,
        r: &Reservation,
        with: (Envelope, Option<FieldTable>, Target),
    ) -> Result<()> {
        self.publisher.send(&self.connector, vec![with]).await?;
        if self.consumers.settle(r).await? {
            Ok(())
        } else {
            Err(lost(r))
        }
    }
}
