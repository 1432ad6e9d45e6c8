use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use lapin::message::{BasicGetMessage, Delivery};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use queue_core::sql::Wakers;
use queue_core::{
    reason, AckReport, Capabilities, DeadLetter, DeadSelection, Envelope, Error, LeaseToken,
    QueueName, QueueStats, Receipt, Reservation, Result, Transport,
};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::options::{AmqpOptions, QueueKind};
use crate::topology::{
    dead_queue, delay_key, delivery_binding, level_binding, level_name, units, DELIVERY_EXCHANGE,
    LEVELS, MAX_QUEUE_NAME, UNIT,
};

const TRANSPORT: &str = "amqp";

/// How long an empty reserve waits for deliveries already on their way to the consumer.
const IN_FLIGHT: Duration = Duration::from_millis(5);

/// Headers of a dead letter.
const H_REASON: &str = "x-switchyard-reason";
const H_DEAD_AT: &str = "x-switchyard-dead-at";

fn broker(err: lapin::Error) -> Error {
    // A closed channel or connection may recover; a refused declaration will not.
    let transient = !matches!(err.kind(), lapin::ErrorKind::ProtocolError(_));
    Error::backend(TRANSPORT, transient, err)
}

/// RabbitMQ over AMQP 0-9-1.
///
/// Each logical queue is a durable queue of its own name (quorum by default, classic
/// with priorities as an option) with a dead-letter queue `<queue>.dead`; delays go
/// through a fixed chain of TTL queues (see the `topology` module). Publishes wait for
/// the broker's confirms, pipelined within a batch. Reserves take deliveries from a
/// consumer with a bounded prefetch; a lease is a delivery, and its token is the
/// delivery tag together with the generation of the consumer's channel, so an ack after
/// the channel was replaced fails with [`Error::LeaseLost`] instead of acking another
/// message. A lease has no expiry of its own: when a consumer's channel closes (its
/// process died, the broker's consumer timeout, a cancel), the broker delivers its
/// messages again, and the delivery counts an attempt.
pub struct AmqpTransport {
    options: AmqpOptions,
    conn: Connection,
    publisher: Channel,
    declared: tokio::sync::Mutex<HashSet<String>>,
    consumers: Mutex<HashMap<String, Arc<QueueConsumer>>>,
    generation: AtomicU64,
    wakers: Arc<Wakers>,
}

impl fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("url", &self.options.url)
            .field("queue_kind", &self.options.queue_kind)
            .finish_non_exhaustive()
    }
}

/// The consumer of one queue: its channel, its generation, and the deliveries it has
/// received but not yet handed out.
struct QueueConsumer {
    generation: u64,
    channel: Channel,
    buffer: Mutex<VecDeque<Delivery>>,
    /// Delivery tags handed out and not yet settled.
    held: Mutex<HashSet<u64>>,
    arrived: Notify,
    closed: AtomicBool,
}

impl AmqpTransport {
    /// Connects and declares the delay chain.
    pub async fn connect(options: AmqpOptions) -> Result<Self> {
        let conn = Connection::connect(options.url.expose(), ConnectionProperties::default())
            .await
            .map_err(broker)?;
        let publisher = conn.create_channel().await.map_err(broker)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(broker)?;
        declare_delay_chain(&publisher).await?;
        Ok(AmqpTransport {
            options,
            conn,
            publisher,
            declared: tokio::sync::Mutex::default(),
            consumers: Mutex::default(),
            generation: AtomicU64::new(1),
            wakers: Arc::default(),
        })
    }

    /// Closes the connection; deliveries held unacknowledged go back to their queues.
    pub async fn close(&self) {
        let _ = self.conn.close(200, "closed".into()).await;
    }

    /// Publishes `body` as it is (not an envelope) to `queue`, with `id` as its message
    /// id: for tests and tools that need a message the transport did not encode.
    #[doc(hidden)]
    pub async fn publish_raw(&self, queue: &QueueName, id: &str, body: &str) -> Result<()> {
        self.ensure_queue(queue.as_str()).await?;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.into());
        self.publish_all(vec![(
            String::new(),
            queue.as_str().to_owned(),
            body.as_bytes().to_vec(),
            props,
        )])
        .await
    }

    /// Deletes `queue` and its dead-letter queue, messages and all.
    pub async fn delete_queue(&self, queue: &QueueName) -> Result<()> {
        let ch = self.conn.create_channel().await.map_err(broker)?;
        for name in [queue.as_str().to_owned(), dead_queue(queue.as_str())] {
            ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(broker)?;
        }
        let _ = ch.close(200, "done".into()).await;
        self.declared.lock().await.remove(queue.as_str());
        Ok(())
    }

    /// Declares `queue` and its dead-letter queue once per transport.
    async fn ensure_queue(&self, queue: &str) -> Result<()> {
        let mut declared = self.declared.lock().await;
        if declared.contains(queue) {
            return Ok(());
        }
        if queue.len() > MAX_QUEUE_NAME {
            return Err(Error::InvalidInput(format!(
                "queue name {queue:?} is {} bytes; on RabbitMQ at most {MAX_QUEUE_NAME} are accepted (delay routing keys and the `.dead` queue need the rest)",
                queue.len()
            )));
        }
        let dead = dead_queue(queue);
        // The dead-letter store is a classic queue: listing it takes and gives back
        // messages, which a quorum queue would count as deliveries.
        self.publisher
            .queue_declare(dead.as_str().into(), durable(), FieldTable::default())
            .await
            .map_err(broker)?;
        let mut args = FieldTable::default();
        args.insert("x-dead-letter-exchange".into(), long_string(""));
        args.insert("x-dead-letter-routing-key".into(), long_string(&dead));
        match self.options.queue_kind {
            QueueKind::Quorum => {
                args.insert("x-queue-type".into(), long_string("quorum"));
                args.insert(
                    "x-delivery-limit".into(),
                    AMQPValue::LongInt(
                        i32::try_from(self.options.delivery_limit).unwrap_or(i32::MAX),
                    ),
                );
            }
            QueueKind::Classic => {
                args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(9));
            }
        }
        self.publisher
            .queue_declare(queue.into(), durable(), args)
            .await
            .map_err(broker)?;
        self.publisher
            .queue_bind(
                queue.into(),
                DELIVERY_EXCHANGE.into(),
                delivery_binding(queue).as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        declared.insert(queue.to_owned());
        Ok(())
    }

    /// The live consumer of `queue`, started (again, with a new generation) when there is
    /// none or its channel closed.
    async fn consumer(&self, queue: &str) -> Result<Arc<QueueConsumer>> {
        if let Some(c) = self.live_consumer(queue) {
            return Ok(c);
        }
        let channel = self.conn.create_channel().await.map_err(broker)?;
        channel
            .basic_qos(self.options.prefetch, BasicQosOptions::default())
            .await
            .map_err(broker)?;
        let stream = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        let consumer = Arc::new(QueueConsumer {
            generation: self.generation.fetch_add(1, Ordering::SeqCst),
            channel,
            buffer: Mutex::default(),
            held: Mutex::default(),
            arrived: Notify::new(),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(receive(
            stream,
            consumer.clone(),
            self.wakers.clone(),
            queue.to_owned(),
        ));
        let mut consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers.insert(queue.to_owned(), consumer.clone());
        Ok(consumer)
    }

    fn live_consumer(&self, queue: &str) -> Option<Arc<QueueConsumer>> {
        let consumers = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        consumers
            .get(queue)
            .filter(|c| !c.closed.load(Ordering::SeqCst))
            .cloned()
    }

    /// The consumer that handed out `r`, if it still holds it: the lease.
    fn holder(&self, r: &Reservation) -> Option<Arc<QueueConsumer>> {
        let (generation, tag) = r.token().0.as_u64_pair();
        let c = self.live_consumer(r.envelope.queue.as_str())?;
        let held = c.generation == generation
            && tag == r.receipt.tag()
            && c.held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&tag);
        held.then_some(c)
    }

    /// Acks the delivery behind `r` on its consumer's channel; `false` when the lease
    /// is gone.
    async fn settle(&self, r: &Reservation) -> Result<bool> {
        let Some(c) = self.holder(r) else {
            return Ok(false);
        };
        let tag = r.receipt.tag();
        if !c
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&tag)
        {
            return Ok(false);
        }
        match c.channel.basic_ack(tag, BasicAckOptions::default()).await {
            Ok(()) => Ok(true),
            // The channel closed: the broker gives the message to someone else.
            Err(_) => Ok(false),
        }
    }

    /// Publishes `envelopes` and waits for every confirm.
    async fn send(&self, messages: Vec<(Envelope, Option<FieldTable>, Target)>) -> Result<()> {
        let now = Utc::now();
        let mut outgoing = Vec::with_capacity(messages.len());
        for (env, headers, target) in messages {
            let mut props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(env.id.to_string().as_str().into())
                .with_type(env.kind.as_str().into())
                .with_priority(u8::try_from(env.priority.clamp(0, 9)).unwrap_or(0));
            if let Some(trace) = &env.trace_id {
                props = props.with_correlation_id(trace.as_str().into());
            }
            if let Some(h) = headers {
                props = props.with_headers(h);
            }
            let (exchange, key) = match target {
                Target::Queue => {
                    if let Some(exp) = env.expires_at {
                        let ms = (exp - now).num_milliseconds().max(0);
                        props = props.with_expiration(ms.to_string().as_str().into());
                    }
                    let delay = (env.available_at - now).to_std().unwrap_or(Duration::ZERO);
                    if delay >= UNIT / 2 {
                        (
                            level_name(LEVELS - 1),
                            delay_key(units(delay), env.queue.as_str()),
                        )
                    } else {
                        (String::new(), env.queue.as_str().to_owned())
                    }
                }
                Target::Dead => (String::new(), dead_queue(env.queue.as_str())),
            };
            outgoing.push((exchange, key, env.to_json().into_bytes(), props));
        }
        self.publish_all(outgoing).await
    }

    /// Publishes `(exchange, routing key, body, properties)` messages, pipelined, and
    /// waits for every confirm.
    async fn publish_all(
        &self,
        messages: Vec<(String, String, Vec<u8>, BasicProperties)>,
    ) -> Result<()> {
        let mut confirms = Vec::with_capacity(messages.len());
        for (exchange, key, body, props) in messages {
            let confirm = self
                .publisher
                .basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    // Mandatory: a message no queue takes comes back instead of being
                    // dropped (and confirmed).
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &body,
                    props,
                )
                .await
                .map_err(broker)?;
            confirms.push(confirm);
        }
        let timeout = self.options.confirm_timeout;
        for confirm in confirms {
            match tokio::time::timeout(timeout, confirm).await {
                Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => {}
                Ok(Ok(Confirmation::Ack(Some(returned)))) => {
                    return Err(Error::backend(
                        TRANSPORT,
                        false,
                        format!(
                            "the broker routed a publish to no queue (returned: {}); was its queue deleted?",
                            returned.reply_text
                        ),
                    ))
                }
                Ok(Ok(Confirmation::Nack(_))) => {
                    return Err(Error::backend(
                        TRANSPORT,
                        true,
                        "the broker refused a publish (nack): it may be short of memory or disk",
                    ))
                }
                Ok(Err(err)) => return Err(broker(err)),
                Err(_) => {
                    return Err(Error::backend(
                        TRANSPORT,
                        true,
                        format!("no confirm from the broker within {timeout:?}"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Turns a delivery into a reservation, or settles it on the way: malformed and
    /// expired messages go to the dead-letter queue, early ones back into the delay
    /// chain, and one delivered again after a closed channel is published again with
    /// the attempt counted (classic queues count nothing themselves).
    async fn admit(
        &self,
        c: &QueueConsumer,
        d: Delivery,
        queue: &str,
    ) -> Result<Option<Reservation>> {
        let tag = d.delivery_tag;
        let text = String::from_utf8_lossy(&d.data).into_owned();
        let mut env = match Envelope::from_json(&text) {
            Ok(env) => env,
            Err(err) => {
                let mut headers = dead_headers(reason::MALFORMED);
                headers.insert("x-switchyard-error".into(), long_string(&err.to_string()));
                let mut props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_headers(headers);
                if let Some(id) = d.properties.message_id() {
                    props = props.with_message_id(id.clone());
                }
                // Kept byte for byte: it is not an envelope.
                self.publish_all(vec![(String::new(), dead_queue(queue), d.data, props)])
                    .await?;
                let _ = c.channel.basic_ack(tag, BasicAckOptions::default()).await;
                return Ok(None);
            }
        };
        let counted = delivery_count(&d);
        let now = Utc::now();
        let early =
            env.available_at > now + chrono::Duration::milliseconds(UNIT.as_millis() as i64 / 2);
        let expired = env.expires_at.is_some_and(|e| e <= now);
        // A classic queue counts no redelivery: publish it again with the attempt counted.
        let recount = d.redelivered && self.options.queue_kind == QueueKind::Classic;
        if expired || early || recount {
            let mut again = env;
            again.attempts += counted;
            let (headers, target) = if expired {
                (Some(dead_headers(reason::EXPIRED)), Target::Dead)
            } else {
                (None, Target::Queue)
            };
            self.send(vec![(again, headers, target)]).await?;
            let _ = c.channel.basic_ack(tag, BasicAckOptions::default()).await;
            return Ok(None);
        }
        env.attempts += counted;
        c.held.lock().unwrap_or_else(|e| e.into_inner()).insert(tag);
        let token = LeaseToken(Uuid::from_u64_pair(c.generation, tag));
        let id = env.id;
        Ok(Some(Reservation {
            envelope: env,
            receipt: Receipt::new(id, token, tag),
        }))
    }

    /// Up to `max` deliveries of `queue`: those the consumer received, or else one ready
    /// message the broker has not pushed yet (`basic.get`); with `in_flight`, when there
    /// is none, it also waits a few milliseconds for a delivery already on its way (a
    /// message published a moment ago).
    async fn pull(
        c: &QueueConsumer,
        queue: &QueueName,
        max: usize,
        in_flight: bool,
    ) -> Result<Vec<Delivery>> {
        let taken = Self::take(c, max);
        if !taken.is_empty() {
            return Ok(taken);
        }
        match c
            .channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .map_err(broker)?
        {
            Some(m) => Ok(vec![m.delivery]),
            None if in_flight => {
                let _ = tokio::time::timeout(IN_FLIGHT, c.arrived.notified()).await;
                Ok(Self::take(c, max))
            }
            None => Ok(Vec::new()),
        }
    }

    /// Takes up to `max` received deliveries of `queue`.
    fn take(c: &QueueConsumer, max: usize) -> Vec<Delivery> {
        let mut buffer = c.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let n = buffer.len().min(max);
        buffer.drain(..n).collect()
    }

    /// Reads every message of `queue`'s dead-letter queue on a channel of its own and
    /// returns the channel with the letters `pick` chose (unacknowledged). Closing the
    /// channel gives back what was not acked, in its order.
    async fn read_dead<F>(
        &self,
        queue: &str,
        mut pick: F,
    ) -> Result<(Channel, Vec<(u64, DeadLetter)>)>
    where
        F: FnMut(&DeadLetter) -> bool,
    {
        self.ensure_queue(queue).await?;
        let ch = self.conn.create_channel().await.map_err(broker)?;
        let dead = dead_queue(queue);
        let mut picked = Vec::new();
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions::default())
            .await
            .map_err(broker)?
        {
            let letter = dead_letter_of(&m, queue);
            if pick(&letter) {
                picked.push((m.delivery.delivery_tag, letter));
            }
        }
        Ok((ch, picked))
    }

    /// The queues a dead-letter command acts on.
    async fn dead_queues(&self, queue: Option<&QueueName>) -> Vec<String> {
        match queue {
            Some(q) => vec![q.as_str().to_owned()],
            None => self.declared.lock().await.iter().cloned().collect(),
        }
    }

    /// Replays (`replay`) or purges the selected dead letters; how many.
    async fn settle_dead(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
        replay: bool,
    ) -> Result<u64> {
        let now = Utc::now();
        let selected = |d: &DeadLetter| match selection {
            DeadSelection::Id(id) => &d.id == id,
            DeadSelection::OlderThan(age) => {
                d.dead_at <= now - chrono::Duration::from_std(*age).unwrap_or_default()
            }
            _ => true,
        };
        let mut n = 0;
        for q in self.dead_queues(queue).await {
            let (ch, picked) = self.read_dead(&q, selected).await?;
            for (tag, letter) in picked {
                if replay {
                    let Some(mut env) = letter.envelope else {
                        // A malformed letter cannot be delivered; it stays.
                        continue;
                    };
                    env.attempts = 0;
                    env.available_at = Utc::now();
                    env.expires_at = None;
                    self.send(vec![(env, None, Target::Queue)]).await?;
                }
                ch.basic_ack(tag, BasicAckOptions::default())
                    .await
                    .map_err(broker)?;
                n += 1;
            }
            let _ = ch.close(200, "done".into()).await;
        }
        if n == 0 {
            if let DeadSelection::Id(id) = selection {
                return Err(Error::NotFound {
                    what: "dead letter",
                    id: id.clone(),
                });
            }
        }
        if replay && n > 0 {
            self.wakers.wake_all();
        }
        Ok(n)
    }
}

/// Where a message is published.
enum Target {
    /// Its queue, through the delay chain when it is not yet due.
    Queue,
    /// Its dead-letter queue.
    Dead,
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

fn dead_headers(why: &str) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(H_REASON.into(), long_string(why));
    headers.insert(
        H_DEAD_AT.into(),
        AMQPValue::LongLongInt(Utc::now().timestamp_millis()),
    );
    headers
}

/// Deliveries of this message that ended without an ack, as the broker tells: a quorum
/// queue's `x-delivery-count`, or 1 for a classic queue's redelivery.
fn delivery_count(d: &Delivery) -> u32 {
    let counted = d.properties.headers().as_ref().and_then(|h| {
        h.inner()
            .get(&ShortString::from("x-delivery-count"))
            .cloned()
    });
    match counted {
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        _ => u32::from(d.redelivered),
    }
}

fn header_str(h: &Option<FieldTable>, key: &str) -> Option<String> {
    match h.as_ref()?.inner().get(&ShortString::from(key))? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The reason of the broker's own dead-lettering (`x-death`): `expired` for a TTL,
/// `delivery_limit` or `rejected` otherwise.
fn broker_death_reason(h: &Option<FieldTable>) -> Option<String> {
    let AMQPValue::FieldArray(deaths) = h.as_ref()?.inner().get(&ShortString::from("x-death"))?
    else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    match first.inner().get(&ShortString::from("reason"))? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

fn dead_letter_of(m: &BasicGetMessage, queue: &str) -> DeadLetter {
    let headers = m.delivery.properties.headers();
    let dead_at = match headers
        .as_ref()
        .and_then(|h| h.inner().get(&ShortString::from(H_DEAD_AT)).cloned())
    {
        Some(AMQPValue::LongLongInt(ms)) => DateTime::from_timestamp_millis(ms),
        _ => None,
    }
    .unwrap_or_else(Utc::now);
    // Dead-lettered by the broker itself (delivery limit, expiry): its x-death header.
    let why = header_str(headers, H_REASON)
        .or_else(|| broker_death_reason(headers))
        .unwrap_or_else(|| "delivery_limit".into());
    let text = String::from_utf8_lossy(&m.delivery.data).into_owned();
    match Envelope::from_json(&text) {
        Ok(env) => {
            let mut d = DeadLetter::new(env.id.to_string(), queue, why, dead_at);
            d.kind.clone_from(&env.kind);
            d.attempts = env.attempts;
            d.last_error.clone_from(&env.last_error);
            d.envelope = Some(env);
            d
        }
        Err(_) => {
            let id = m
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            let mut d = DeadLetter::new(id, queue, why, dead_at);
            d.last_error = header_str(headers, "x-switchyard-error");
            d.raw = Some(text);
            d
        }
    }
}

/// Moves deliveries from the broker into the consumer's buffer until its channel
/// closes, waking the queue's idle workers.
async fn receive(
    mut stream: lapin::Consumer,
    c: Arc<QueueConsumer>,
    wakers: Arc<Wakers>,
    queue: String,
) {
    while let Some(next) = stream.next().await {
        match next {
            Ok(d) => {
                c.buffer
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_back(d);
                c.arrived.notify_waiters();
                wakers.wake(&queue);
            }
            Err(err) => {
                tracing::debug!(queue, error = %err, "consumer stopped");
                break;
            }
        }
    }
    // Its deliveries go back to the queue with the channel: the leases are gone.
    c.closed.store(true, Ordering::SeqCst);
    c.buffer.lock().unwrap_or_else(|e| e.into_inner()).clear();
    wakers.wake(&queue);
}

async fn declare_delay_chain(ch: &Channel) -> Result<()> {
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    ch.exchange_declare(
        DELIVERY_EXCHANGE.into(),
        ExchangeKind::Topic,
        durable_exchange,
        FieldTable::default(),
    )
    .await
    .map_err(broker)?;
    for k in 0..LEVELS {
        ch.exchange_declare(
            level_name(k).as_str().into(),
            ExchangeKind::Topic,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
    }
    for k in 0..LEVELS {
        let next = if k == 0 {
            DELIVERY_EXCHANGE.to_owned()
        } else {
            level_name(k - 1)
        };
        let mut args = FieldTable::default();
        let ttl = UNIT.as_millis() * (1u128 << k);
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(i64::try_from(ttl).unwrap_or(i64::MAX)),
        );
        args.insert("x-dead-letter-exchange".into(), long_string(&next));
        args.insert("x-queue-type".into(), long_string("quorum"));
        // Never lose a message between levels: the broker confirms the hop.
        args.insert(
            "x-dead-letter-strategy".into(),
            long_string("at-least-once"),
        );
        args.insert("x-overflow".into(), long_string("reject-publish"));
        let name = level_name(k);
        ch.queue_declare(name.as_str().into(), durable(), args)
            .await
            .map_err(broker)?;
        ch.queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            level_binding(k, true).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
        ch.exchange_bind(
            next.as_str().into(),
            name.as_str().into(),
            level_binding(k, false).as_str().into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
    }
    Ok(())
}

fn lost(r: &Reservation) -> Error {
    Error::LeaseLost { message_id: r.id() }
}

#[async_trait]
impl Transport for AmqpTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.priorities = self.options.queue_kind == QueueKind::Classic;
        caps.expiry = true;
        caps.wake_signal = true;
        caps.max_payload_bytes = self.options.max_payload_bytes;
        caps
    }

    fn waker(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        Some(self.wakers.get(queue.as_str()))
    }

    async fn publish_batch(&self, envelopes: Vec<Envelope>) -> Result<()> {
        for env in &envelopes {
            env.check_size(self.options.max_payload_bytes)?;
        }
        let queues: HashSet<&str> = envelopes.iter().map(|e| e.queue.as_str()).collect();
        for q in queues {
            self.ensure_queue(q).await?;
        }
        self.send(
            envelopes
                .into_iter()
                .map(|e| (e, None, Target::Queue))
                .collect(),
        )
        .await
    }

    async fn reserve_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.ensure_queue(queue.as_str()).await?;
        let c = self.consumer(queue.as_str()).await?;
        let mut deliveries = Self::pull(&c, queue, max, true).await?;
        let mut out = Vec::with_capacity(deliveries.len());
        loop {
            let settled_some = !deliveries.is_empty();
            for d in deliveries {
                if let Some(r) = self.admit(&c, d, queue.as_str()).await? {
                    out.push(r);
                }
            }
            // Everything taken was settled on the way (malformed, expired, early): look
            // again rather than report an empty queue that may hold more.
            if !out.is_empty() || !settled_some {
                return Ok(out);
            }
            deliveries = Self::pull(&c, queue, max, false).await?;
        }
    }

    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        let mut report = AckReport::default();
        for r in reservations {
            if self.settle(r).await? {
                report.acked.push(r.id());
            } else {
                report.lost.push(r.id());
            }
        }
        Ok(report)
    }

    async fn release(
        &self,
        reservation: &Reservation,
        delay: Duration,
        error: Option<&str>,
    ) -> Result<()> {
        if self.holder(reservation).is_none() {
            return Err(lost(reservation));
        }
        let mut env = reservation.envelope.clone();
        env.attempts += 1;
        env.available_at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
        if let Some(e) = error {
            env.last_error = Some(e.to_owned());
        }
        // Published and confirmed before the original is acked: at worst twice, never
        // lost.
        self.send(vec![(env, None, Target::Queue)]).await?;
        if self.settle(reservation).await? {
            Ok(())
        } else {
            Err(lost(reservation))
        }
    }

    async fn abandon(&self, reservation: &Reservation) -> Result<()> {
        if self.holder(reservation).is_none() {
            return Err(lost(reservation));
        }
        self.send(vec![(reservation.envelope.clone(), None, Target::Queue)])
            .await?;
        if self.settle(reservation).await? {
            Ok(())
        } else {
            Err(lost(reservation))
        }
    }

    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        if self.holder(reservation).is_none() {
            return Err(lost(reservation));
        }
        let mut env = reservation.envelope.clone();
        env.attempts += 1;
        if let Some(e) = error {
            env.last_error = Some(e.to_owned());
        }
        self.send(vec![(env, Some(dead_headers(reason)), Target::Dead)])
            .await?;
        if self.settle(reservation).await? {
            Ok(())
        } else {
            Err(lost(reservation))
        }
    }

    async fn extend(&self, reservation: &Reservation, _lease: Duration) -> Result<()> {
        // A delivery has no lease to renew: it is held until acked or its channel closes.
        if self.holder(reservation).is_some() {
            Ok(())
        } else {
            Err(lost(reservation))
        }
    }

    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        let queues: Vec<String> = match queue {
            Some(q) => vec![q.as_str().to_owned()],
            None => self.declared.lock().await.iter().cloned().collect(),
        };
        let mut out = Vec::new();
        for q in queues {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let ch = self.conn.create_channel().await.map_err(broker)?;
            let main = ch
                .queue_declare(q.as_str().into(), passive, FieldTable::default())
                .await;
            let Ok(main) = main else {
                // A queue never declared has nothing in it.
                continue;
            };
            let dead = ch
                .queue_declare(
                    dead_queue(&q).as_str().into(),
                    passive,
                    FieldTable::default(),
                )
                .await
                .map_err(broker)?;
            let _ = ch.close(200, "done".into()).await;
            let mut s = QueueStats::new(q.as_str());
            let held = self.live_consumer(&q).map_or(0, |c| {
                c.held.lock().unwrap_or_else(|e| e.into_inner()).len()
                    + c.buffer.lock().unwrap_or_else(|e| e.into_inner()).len()
            });
            s.ready = u64::from(main.message_count());
            s.reserved = held as u64;
            s.dead = u64::from(dead.message_count());
            out.push(s);
        }
        Ok(out)
    }

    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut out = Vec::new();
        for q in self.dead_queues(queue).await {
            let (ch, picked) = self.read_dead(&q, |_| true).await?;
            let _ = ch.close(200, "done".into()).await;
            out.extend(picked.into_iter().map(|(_, d)| d));
        }
        out.sort_by_key(|d| d.dead_at);
        out.truncate(limit);
        Ok(out)
    }

    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, true).await
    }

    async fn dead_purge(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, false).await
    }
}
