//! Turning a consumer's deliveries into reservations: pulling up to the claim's size,
//! and settling on the way what must not be handed out (malformed messages, those of
//! another queue, expired ones, early ones, and redeliveries a classic queue did not
//! count), with each delivery charged the attempts its returns cost.

use std::time::Instant;

use chrono::Utc;
use lapin::message::Delivery;
use lapin::BasicProperties;
use queue_core::{
    reason, text, Envelope, LeaseToken, Receipt, Reservation, Result, DEFAULT_VISIBILITY_TIMEOUT,
};
use uuid::Uuid;

use crate::codec::{dead_headers, delivery_count, long_string, H_ERROR};
use crate::consumer::{ack_one, QueueConsumer};
use crate::gate::KeyGate;
use crate::link::Connector;
use crate::marks;
use crate::options::QueueKind;
use crate::publish::{publish_all, Publisher, Target};
use crate::topology::{dead_queue, physical_queue, UNIT};

/// A claim on one queue's consumer, with what it publishes through when it settles a
/// delivery on the way.
pub(crate) struct Claimer<'a> {
    pub(crate) connector: &'a Connector,
    pub(crate) publisher: &'a Publisher,
    pub(crate) consumer: &'a QueueConsumer,
    /// A worker's prefetch: the deliveries waiting are enough (it claims again at once),
    /// where a reserve asks the broker for the rest of its batch.
    pub(crate) prefetch: bool,
}

impl Claimer<'_> {
    /// Up to `max` reservations from the consumer of the broker queue `queue` (the
    /// logical queue `logical` itself, or one of its partitions), marked started or not.
    /// A partition's consumer hands out at most one message per ordering key at a time
    /// (its [`KeyGate`](crate::gate::KeyGate)).
    pub(crate) async fn claim(
        &self,
        queue: &str,
        logical: &str,
        max: usize,
        started: bool,
    ) -> Result<Vec<Reservation>> {
        let gate = self.consumer.gate.as_ref();
        let _one = match gate {
            Some(_) => Some(self.consumer.claiming.lock().await),
            None => None,
        };
        let mut out = gate.map(|g| g.ready(max)).unwrap_or_default();
        if out.len() < max {
            let mut deliveries = self
                .consumer
                .pull(queue, max - out.len(), self.prefetch)
                .await?;
            loop {
                let settled_some = !deliveries.is_empty();
                for d in deliveries {
                    let admitted = self.admit(d, queue, logical, started && gate.is_none());
                    let Some(r) = admitted.await? else { continue };
                    match gate {
                        None => out.push(r),
                        Some(g) => out.extend(g.offer(r)),
                    }
                }
                // Everything taken was settled on the way (malformed, expired, early,
                // parked behind its key): look again rather than report an empty queue
                // that may hold more.
                if !out.is_empty() || !settled_some {
                    break;
                }
                deliveries = self.consumer.pull(queue, max, self.prefetch).await?;
            }
        }
        if let Some(g) = gate {
            out = self.due_and_unexpired(g, out, logical).await?;
            if started {
                for r in &mut out {
                    self.consumer.hold(r.receipt.tag(), true);
                    r.started = true;
                }
            }
        }
        Ok(out)
    }

    /// Of the messages a partition's gate let out, those that may run now. One that
    /// expired while it waited behind its key is dead-lettered, and its key moves on;
    /// one not due yet (a delay that came out of the chain early, or a publisher's clock
    /// ahead of this one) waits in the gate as its key's head until it is due, rather
    /// than going back through the delay chain behind its key's later messages.
    async fn due_and_unexpired(
        &self,
        gate: &KeyGate,
        out: Vec<Reservation>,
        logical: &str,
    ) -> Result<Vec<Reservation>> {
        let now = Utc::now();
        let mut kept = Vec::with_capacity(out.len());
        for r in out {
            let key = r.envelope.ordering_key.clone().unwrap_or_default();
            if r.envelope.expires_at.is_some_and(|e| e <= now) {
                let headers = Some(dead_headers(reason::EXPIRED));
                self.publisher
                    .send(
                        self.connector,
                        vec![(r.envelope.clone(), headers, Target::Dead)],
                    )
                    .await?;
                if ack_one(self.consumer, r.receipt.tag()).await
                    && self.consumer.acks_processed().await
                {
                    gate.release(&key);
                }
                continue;
            }
            let early = (r.envelope.available_at - now).to_std().unwrap_or_default();
            if early > UNIT / 2 {
                gate.retry(r, Instant::now() + early);
                let wakers = self.connector.wakers().clone();
                let queue = logical.to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep(early).await;
                    wakers.wake(&queue);
                });
                continue;
            }
            kept.push(r);
        }
        Ok(kept)
    }

    /// Turns a delivery into a reservation, or settles it on the way: malformed and
    /// expired messages go to the dead-letter queue, early ones back into the delay
    /// chain, and one delivered again after a closed channel is published again with
    /// the attempt counted (classic queues count nothing themselves).
    async fn admit(
        &self,
        d: Delivery,
        queue: &str,
        logical: &str,
        started: bool,
    ) -> Result<Option<Reservation>> {
        let tag = d.delivery_tag;
        let text = String::from_utf8_lossy(&d.data).into_owned();
        let mut env = match Envelope::from_json(&text) {
            Ok(env) => env,
            Err(err) => {
                self.quarantine(d, logical, &err.to_string()).await?;
                return Ok(None);
            }
        };
        if physical_queue(&env) != queue {
            // A shovel, an operator's move or a misbinding put it here. Its lease would
            // be looked up under the queue it names, so no worker of this queue could
            // ever settle it: quarantined here, a replay sends it to its own queue.
            let why = format!(
                "the envelope names queue `{}` but was delivered from queue `{queue}` (moved by a shovel, an operator or a misbinding); replay it to send it to its own queue",
                env.queue
            );
            tracing::warn!(queue, message_id = %env.id, named = %env.queue, "message of another queue quarantined");
            self.quarantine(d, logical, &why).await?;
            return Ok(None);
        }
        self.publisher.came_out(logical, env.id);
        let counted = self.deliveries_charged(&d, &env).await;
        let options = self.connector.options();
        let now = Utc::now();
        // A partition's consumer holds an early message in its gate instead (see
        // `due_and_unexpired`): published again, it would go behind its key.
        let early = self.consumer.gate.is_none()
            && env.available_at > now + chrono::Duration::milliseconds(UNIT.as_millis() as i64 / 2);
        let expired = env.expires_at.is_some_and(|e| e <= now);
        // A classic queue counts no redelivery: publish it again with the attempt counted
        // (with start marks, the control store keeps the count instead).
        // Not a keyed one: published again, it would go behind its key's later messages.
        let recount = d.redelivered
            && options.queue_kind == QueueKind::Classic
            && options.control_store.is_none()
            && env.ordering_key.is_none();
        if expired || early || recount {
            let mut again = env;
            again.attempts += counted;
            let (headers, target) = if expired {
                (Some(dead_headers(reason::EXPIRED)), Target::Dead)
            } else {
                (None, Target::Queue)
            };
            self.publisher
                .send(self.connector, vec![(again, headers, target)])
                .await?;
            ack_one(self.consumer, tag).await;
            return Ok(None);
        }
        env.attempts += counted;
        if started {
            self.consumer.hold(tag, true);
        }
        let token = LeaseToken(Uuid::from_u64_pair(self.consumer.generation, tag));
        let id = env.id;
        // A delivery has no lease that runs out: it is held until acked or its channel
        // closes, so a heartbeat at the usual pace only checks that it is still held.
        Ok(Some(Reservation::new(
            env,
            Receipt::new(id, token, tag),
            DEFAULT_VISIBILITY_TIMEOUT,
            started,
        )))
    }

    /// Moves the delivery `d` of `queue` to that queue's dead-letter queue with reason
    /// `malformed` and `why` in its headers, its body byte for byte, then acks it.
    async fn quarantine(&self, d: Delivery, queue: &str, why: &str) -> Result<()> {
        let mut headers = dead_headers(reason::MALFORMED);
        headers.insert(H_ERROR.into(), long_string(&text::error_text(why)));
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = d.properties.message_id() {
            props = props.with_message_id(id.clone());
        }
        let tag = d.delivery_tag;
        publish_all(
            self.connector,
            vec![(String::new(), dead_queue(queue), d.data, props)],
        )
        .await?;
        ack_one(self.consumer, tag).await;
        Ok(())
    }

    /// Deliveries of the message in `d` that ended without an ack and are not counted in
    /// `env.attempts` yet. Without a control store, what the broker tells
    /// ([`delivery_count`]): every return counts, started or not. With one, a message
    /// that came back counts only the start its mark records (`running` at an attempt
    /// above the envelope's): deliveries a dead consumer merely held are not charged.
    async fn deliveries_charged(&self, d: &Delivery, env: &Envelope) -> u32 {
        let counted = delivery_count(d);
        let Some(store) = &self.connector.options().control_store else {
            return counted;
        };
        if counted == 0 && !d.redelivered {
            return 0;
        }
        marks::charged_returns(store.as_ref(), env, counted).await
    }
}
