use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use queue_core::sql::Wakers;
use queue_core::status::StatusStore;
use queue_core::{
    reason, text, AckReport, Capabilities, Claim, DeadLetter, DeadLetters, DeadSelection, Envelope,
    Error, GiveBack, LeaseToken, QueueName, QueueStats, Receipt, Reservation, Result, Start,
    Transport, DEFAULT_VISIBILITY_TIMEOUT,
};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::codec::{
    dead_headers, dead_letter_of, delivery_count, long_string, short_string, H_DEAD_AT, H_ERROR,
    H_REASON,
};
use crate::connect::{self, Node};
use crate::marks;
use crate::options::{AmqpOptions, QueueKind};
use crate::topology::{
    dead_queue, delay_key, delivery_binding, level_binding, level_name, units, DELIVERY_EXCHANGE,
    LEVELS, MAX_QUEUE_NAME, UNIT,
};

pub(crate) const TRANSPORT: &str = "amqp";

/// How long a channel or connection close waits for the broker's answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long past its due time a delayed message still counts as delayed when this
/// process has not seen it come out (another process took it).
const DELAY_GRACE: Duration = Duration::from_secs(30);
/// How long an empty reserve waits for deliveries on their way to the consumer.
const IN_FLIGHT: Duration = Duration::from_millis(5);
/// How long a new consumer waits for the broker's first pushes.
const WARM_UP: Duration = Duration::from_millis(200);
/// How long setting up a new connection may take once it is open (channel, confirm
/// mode, the delay chain's declarations).
const SETUP_TIMEOUT: Duration = Duration::from_secs(25);
/// The longest pause between reconnect attempts.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// A message as published: exchange, routing key, body, properties.
type Outgoing = (String, String, Vec<u8>, BasicProperties);

fn closed_error() -> Error {
    Error::backend(TRANSPORT, false, "the RabbitMQ transport was closed")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A refused queue declaration, most often a queue that exists with other arguments.
fn declare_error(queue: &str, err: lapin::Error) -> Error {
    Error::backend(
        TRANSPORT,
        false,
        format!("declaring queue {queue:?} failed (does it exist with other arguments, say as a classic queue where a quorum queue is configured?): {err}"),
    )
}

/// An error's own message, without the transport's name in front.
fn source_text(err: &Error) -> String {
    match err {
        Error::Backend { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

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
///
/// When the connection drops (a broker restart, a network fault), the next operation
/// reconnects with backoff for up to [`AmqpOptions::reconnect_timeout`], declares the
/// topology again and starts new consumers; a publish cut off on the way is published
/// again (at least once), and leases of the old connection are lost.
pub struct AmqpTransport {
    options: AmqpOptions,
    /// The broker's addresses: one, or the nodes of a cluster.
    nodes: Vec<Node>,
    link: Mutex<Arc<Link>>,
    /// One reconnect at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// When and why the last reconnect gave up.
    last_failure: Mutex<Option<(Instant, String)>>,
    /// Set by [`AmqpTransport::close`]: no reconnecting after it.
    shut: AtomicBool,
    /// Every queue this transport used, for stats and dead-letter commands over all.
    known: Mutex<HashSet<String>>,
    consumers: Mutex<HashMap<String, Arc<QueueConsumer>>>,
    /// One consumer start at a time.
    starting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    wakers: Arc<Wakers>,
    /// Messages this transport sent into the delay chain and has not seen come out, per
    /// queue, with when to stop counting them: the `delayed` of its stats. The chain is
    /// shared by every queue, so the broker cannot count them per queue.
    delayed: Mutex<HashMap<String, HashMap<Uuid, Instant>>>,
}

impl fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("url", &self.options.url)
            .field("queue_kind", &self.options.queue_kind)
            .finish_non_exhaustive()
    }
}

/// One connection with its publishing channel (in confirm mode), and the queues declared
/// on it.
struct Link {
    /// Which of the transport's nodes this connection is to.
    node: usize,
    conn: Connection,
    publisher: Channel,
    declared: Mutex<HashSet<String>>,
}

impl Link {
    /// Connects to the first node that answers, trying them in turn from `first`, and
    /// declares the delay chain. With several nodes a failure lists each node's cause.
    async fn open(options: &AmqpOptions, nodes: &[Node], first: usize) -> Result<Link> {
        let mut causes = Vec::new();
        let mut transient = false;
        for k in 0..nodes.len() {
            let node = (first + k) % nodes.len();
            match Link::open_on(options, &nodes[node], node).await {
                Ok(link) => return Ok(link),
                Err(err) if nodes.len() == 1 => return Err(err),
                Err(err) => {
                    transient |= err.is_transient();
                    causes.push(source_text(&err));
                }
            }
        }
        Err(Error::backend(
            TRANSPORT,
            transient,
            format!(
                "no node of the cluster answered ({} tried): {}",
                nodes.len(),
                causes.join("; ")
            ),
        ))
    }

    async fn open_on(options: &AmqpOptions, node: &Node, index: usize) -> Result<Link> {
        let mut props = ConnectionProperties::default();
        if let Some(name) = &options.connection_name {
            props = props.with_connection_name(name.as_str().into());
        }
        let conn = node.connect(props, options.connect_timeout).await?;
        let setup = async {
            let publisher = conn.create_channel().await.map_err(broker)?;
            publisher
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(broker)?;
            declare_delay_chain(&publisher).await?;
            Ok::<_, Error>(publisher)
        };
        let publisher = match tokio::time::timeout(SETUP_TIMEOUT, setup).await {
            Ok(Ok(publisher)) => publisher,
            Ok(Err(err)) => {
                let _ = conn.close(200, "set-up failed".into()).await;
                return Err(err);
            }
            Err(_) => {
                let _ = conn.close(200, "set-up timed out".into()).await;
                return Err(Error::backend(
                    TRANSPORT,
                    true,
                    format!(
                        "{}: connected, but setting up the channel and the delay chain took over {SETUP_TIMEOUT:?}",
                        node.endpoint
                    ),
                ));
            }
        };
        tracing::info!(node = %node.endpoint, "connected to RabbitMQ");
        Ok(Link {
            node: index,
            conn,
            publisher,
            declared: Mutex::default(),
        })
    }

    fn usable(&self) -> bool {
        self.conn.status().connected() && self.publisher.status().connected()
    }
}

/// The consumer of one queue: its channel, its generation, and the deliveries it has
/// received but not yet handed out.
struct QueueConsumer {
    generation: u64,
    channel: Channel,
    buffer: Mutex<VecDeque<Delivery>>,
    /// Delivery tags taken from the buffer (being admitted, or handed out) and not yet
    /// settled, with whether a handler started them (`start_batch`): a dead letter
    /// charges an attempt only to a started one. Locked after `buffer`.
    held: Mutex<HashMap<u64, bool>>,
    /// A clone of the consumer that [`receive`] polls, for a reserve to take what lapin
    /// has received and `receive` has not moved yet. Locked after `buffer`.
    direct: Mutex<lapin::Consumer>,
    /// Tells [`receive`] to stop: `direct` saw the consumer end.
    stop: Notify,
    /// Signalled by [`receive`] when it buffered a delivery.
    arrived: Notify,
    /// Acks one at a time, each taking its tags out of `held` and sending them in one
    /// step: a `multiple` ack never covers a tag another ack is about to name (which the
    /// broker would answer by closing the channel).
    acking: tokio::sync::Mutex<()>,
    /// `basic.get`s under way: their deliveries have tags but are not in `held` yet, so
    /// no `multiple` ack may be sent meanwhile.
    getting: AtomicUsize,
    closed: AtomicBool,
}

impl QueueConsumer {
    fn live(&self) -> bool {
        !self.closed.load(Ordering::SeqCst) && self.channel.status().connected()
    }
}

impl AmqpTransport {
    /// Connects and declares the delay chain.
    ///
    /// While the broker cannot be reached (a transient error), the first connect tries
    /// again with backoff (100 ms doubling to 5 s, a warning each time) for up to
    /// [`AmqpOptions::reconnect_timeout`], like an operation on a dropped connection,
    /// so that a process started during an outage waits for the broker instead of
    /// failing at once. [`AmqpOptions::retry_first_connect`] off (read-only tools) makes
    /// it fail at the first refusal. Errors that retrying cannot fix (a bad URL, refused
    /// credentials, a refused declaration) fail at once.
    pub async fn connect(options: AmqpOptions) -> Result<Self> {
        let nodes = connect::nodes(&options.url)?;
        let deadline = Instant::now() + options.reconnect_timeout;
        let mut pause = Duration::from_millis(100);
        let mut tries = 0_u32;
        let link = loop {
            tries += 1;
            // Each node's attempt is bounded: connect_timeout, then SETUP_TIMEOUT.
            let opened = Link::open(&options, &nodes, 0).await;
            match opened {
                Ok(link) => break link,
                Err(err) if !options.retry_first_connect || !err.is_transient() => {
                    return Err(err)
                }
                Err(err) if Instant::now() + pause < deadline => {
                    tracing::warn!(error = %err, retry_in = ?pause, "RabbitMQ unreachable; connecting again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RECONNECT_PAUSE);
                }
                Err(err) if tries == 1 => return Err(err),
                Err(err) => {
                    return Err(Error::backend(
                        TRANSPORT,
                        true,
                        format!(
                            "RabbitMQ stayed unreachable for {:?} (reconnect_timeout, {tries} tries): {err}",
                            options.reconnect_timeout
                        ),
                    ))
                }
            }
        };
        Ok(AmqpTransport {
            options,
            nodes,
            link: Mutex::new(Arc::new(link)),
            reconnecting: tokio::sync::Mutex::default(),
            last_failure: Mutex::default(),
            shut: AtomicBool::new(false),
            known: Mutex::default(),
            consumers: Mutex::default(),
            starting: tokio::sync::Mutex::default(),
            // A random start, so that a token of another transport never matches.
            generation: AtomicU64::new(Uuid::new_v4().as_u64_pair().0 >> 1),
            wakers: Arc::default(),
            delayed: Mutex::default(),
        })
    }

    /// Closes the connection; deliveries held unacknowledged go back to their queues.
    pub async fn close(&self) {
        self.shut.store(true, Ordering::SeqCst);
        let link = self.current();
        let _ = link.conn.close(200, "closed".into()).await;
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
        let link = self.link().await?;
        let ch = link.conn.create_channel().await.map_err(broker)?;
        for name in [queue.as_str().to_owned(), dead_queue(queue.as_str())] {
            ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(broker)?;
        }
        let _ = ch.close(200, "done".into()).await;
        lock(&link.declared).remove(queue.as_str());
        lock(&self.known).remove(queue.as_str());
        Ok(())
    }

    /// The queues this transport declared (the dead-letter queues not listed).
    #[doc(hidden)]
    pub fn queues(&self) -> Vec<String> {
        lock(&self.known).iter().cloned().collect()
    }

    /// The node of the current connection, as `host:port`: for operators and tests
    /// that follow a cluster's failover.
    pub fn connected_node(&self) -> String {
        let endpoint = &self.nodes[self.current().node].endpoint;
        format!("{}:{}", endpoint.host, endpoint.port)
    }

    fn current(&self) -> Arc<Link> {
        lock(&self.link).clone()
    }

    /// The live connection, reconnecting with backoff when it dropped.
    async fn link(&self) -> Result<Arc<Link>> {
        let current = self.current();
        if current.usable() {
            return Ok(current);
        }
        let waited_from = Instant::now();
        let _one = self.reconnecting.lock().await;
        let current = self.current();
        if current.usable() {
            return Ok(current);
        }
        self.check_open()?;
        // Another caller's attempt ended in failure while this one waited for its turn:
        // share its outcome rather than wait a whole reconnect_timeout more.
        if let Some((at, why)) = lock(&self.last_failure).clone() {
            if at >= waited_from {
                return Err(Error::backend(TRANSPORT, true, why));
            }
        }
        // A closed publishing channel on a live connection: start over on a new one, so
        // that the old consumers close too and their deliveries return.
        let _ = tokio::time::timeout(
            CONNECT_TIMEOUT,
            current.conn.close(200, "reconnecting".into()),
        )
        .await;
        let deadline = Instant::now() + self.options.reconnect_timeout;
        let mut pause = Duration::from_millis(100);
        loop {
            self.check_open()?;
            // The next node first: the lost one is likely down. Each node's attempt is
            // bounded (connect_timeout, then SETUP_TIMEOUT).
            let next = (current.node + 1) % self.nodes.len();
            let opened = Link::open(&self.options, &self.nodes, next).await;
            match opened {
                Ok(link) => {
                    if self.shut.load(Ordering::SeqCst) {
                        let _ = link.conn.close(200, "closed".into()).await;
                        return Err(closed_error());
                    }
                    let link = Arc::new(link);
                    *lock(&self.link) = link.clone();
                    *lock(&self.last_failure) = None;
                    tracing::info!(node = %self.nodes[link.node].endpoint, "reconnected to RabbitMQ");
                    // Idle workers reserve again, which starts new consumers.
                    self.wakers.wake_all();
                    return Ok(link);
                }
                Err(err) if Instant::now() + pause < deadline => {
                    tracing::warn!(error = %err, retry_in = ?pause, "RabbitMQ unreachable; reconnecting");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RECONNECT_PAUSE);
                }
                Err(err) => {
                    let why = format!(
                        "RabbitMQ stayed unreachable for {:?} (reconnect_timeout): {err}",
                        self.options.reconnect_timeout
                    );
                    *lock(&self.last_failure) = Some((Instant::now(), why.clone()));
                    return Err(Error::backend(TRANSPORT, true, why));
                }
            }
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.shut.load(Ordering::SeqCst) {
            return Err(closed_error());
        }
        Ok(())
    }

    /// Declares `queue` and its dead-letter queue once per connection.
    async fn ensure_queue(&self, queue: &str) -> Result<()> {
        if queue.len() > MAX_QUEUE_NAME {
            return Err(Error::InvalidInput(format!(
                "queue name {queue:?} is {} bytes; on RabbitMQ at most {MAX_QUEUE_NAME} are accepted (delay routing keys and the `.dead` queue need the rest)",
                queue.len()
            )));
        }
        let link = self.link().await?;
        if lock(&link.declared).contains(queue) {
            return Ok(());
        }
        // A channel of its own: a refused declaration closes the channel it ran on.
        let ch = link.conn.create_channel().await.map_err(broker)?;
        let dead = dead_queue(queue);
        let mut dead_args = FieldTable::default();
        let mut args = FieldTable::default();
        if let Some(after) = self.options.queue_expires {
            let ms = AMQPValue::LongLongInt(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
            dead_args.insert("x-expires".into(), ms.clone());
            args.insert("x-expires".into(), ms);
        }
        // With quorum queues the dead-letter store is one too: replicated like them, so
        // that losing the node a classic queue lives on neither loses dead letters nor
        // blocks every later declaration (and so every publish) of the queue. Listing
        // it takes and gives back messages, which a quorum queue counts as deliveries;
        // with no delivery limit on it that costs nothing. A dead-letter queue declared
        // classic by an earlier version is kept as it is.
        let declare_dead = match self.options.queue_kind {
            QueueKind::Quorum => {
                dead_args.insert("x-queue-type".into(), long_string("quorum"));
                !self.queue_exists(&dead).await?
            }
            QueueKind::Classic => true,
        };
        if declare_dead {
            ch.queue_declare(dead.as_str().into(), durable(), dead_args)
                .await
                .map_err(|e| declare_error(queue, e))?;
        }
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
        ch.queue_declare(queue.into(), durable(), args)
            .await
            .map_err(|e| declare_error(queue, e))?;
        ch.queue_bind(
            queue.into(),
            DELIVERY_EXCHANGE.into(),
            delivery_binding(queue).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
        let _ = ch.close(200, "declared".into()).await;
        lock(&link.declared).insert(queue.to_owned());
        lock(&self.known).insert(queue.to_owned());
        Ok(())
    }

    /// The live consumer of `queue`, started (again, with a new generation) when there is
    /// none or its channel closed.
    async fn consumer(&self, queue: &str) -> Result<Arc<QueueConsumer>> {
        if let Some(c) = self.live_consumer(queue) {
            return Ok(c);
        }
        // One start at a time: two would leave one consumer, and what it holds, orphaned.
        let _one = self.starting.lock().await;
        if let Some(c) = self.live_consumer(queue) {
            return Ok(c);
        }
        let replaced = lock(&self.consumers).remove(queue);
        if let Some(old) = replaced {
            retire(&old).await;
        }
        let link = self.link().await?;
        let channel = link.conn.create_channel().await.map_err(broker)?;
        channel
            .basic_qos(self.options.prefetch, BasicQosOptions::default())
            .await
            .map_err(broker)?;
        // What the broker will push at once, so that a reserve right after a publish sees
        // it all (up to the prefetch), as it would on a database.
        let ready = channel
            .queue_declare(queue.into(), passive(), FieldTable::default())
            .await
            .map_err(broker)?
            .message_count();
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
            direct: Mutex::new(stream.clone()),
            stop: Notify::new(),
            arrived: Notify::new(),
            acking: tokio::sync::Mutex::default(),
            getting: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(receive(
            stream,
            consumer.clone(),
            self.wakers.clone(),
            link,
            queue.to_owned(),
        ));
        lock(&self.consumers).insert(queue.to_owned(), consumer.clone());
        let expect = ready.min(u32::from(self.options.prefetch)) as usize;
        let deadline = Instant::now() + WARM_UP;
        while Self::fill(&consumer) < expect && consumer.live() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(consumer)
    }

    fn live_consumer(&self, queue: &str) -> Option<Arc<QueueConsumer>> {
        lock(&self.consumers)
            .get(queue)
            .filter(|c| c.live())
            .cloned()
    }

    /// The consumer that handed out `r`, if it still holds it: the lease.
    fn holder(&self, r: &Reservation) -> Option<Arc<QueueConsumer>> {
        let (generation, tag) = r.token().0.as_u64_pair();
        let c = self.live_consumer(r.envelope.queue.as_str())?;
        let held = c.generation == generation
            && tag == r.receipt.tag()
            && lock(&c.held).contains_key(&tag);
        held.then_some(c)
    }

    /// Acks the delivery behind `r` on its consumer's channel; `false` when the lease
    /// is gone.
    async fn settle(&self, r: &Reservation) -> Result<bool> {
        let Some(c) = self.holder(r) else {
            return Ok(false);
        };
        Ok(ack_one(&c, r.receipt.tag()).await)
    }

    /// Publishes the message that takes `r`'s place (released, given back, or dead),
    /// waits for the confirm, and only then acks `r`: at worst twice, never lost.
    async fn replace(
        &self,
        r: &Reservation,
        with: (Envelope, Option<FieldTable>, Target),
    ) -> Result<()> {
        self.send(vec![with]).await?;
        if self.settle(r).await? {
            Ok(())
        } else {
            Err(lost(r))
        }
    }

    /// Publishes `envelopes` and waits for every confirm.
    async fn send(&self, messages: Vec<(Envelope, Option<FieldTable>, Target)>) -> Result<()> {
        let now = Utc::now();
        let mut outgoing = Vec::with_capacity(messages.len());
        for (env, headers, target) in messages {
            // The body is the v1 envelope as UTF-8 JSON, for consumers other than this
            // transport (a shovel, a service in another language); uncompressed, so no
            // content_encoding.
            let mut props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_message_id(env.id.to_string().as_str().into())
                .with_type(short_string(&env.kind))
                .with_priority(u8::try_from(env.priority.clamp(0, 9)).unwrap_or(0));
            if let Some(trace) = &env.trace_id {
                props = props.with_correlation_id(short_string(trace));
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
                        lock(&self.delayed)
                            .entry(env.queue.as_str().to_owned())
                            .or_default()
                            .insert(env.id, Instant::now() + delay + DELAY_GRACE);
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
    /// waits for every confirm. When the connection drops on the way, it publishes them
    /// all again on the next one: some may then be delivered twice, none is lost.
    async fn publish_all(&self, messages: Vec<Outgoing>) -> Result<()> {
        let deadline = Instant::now() + self.options.reconnect_timeout;
        loop {
            let link = self.link().await?;
            match self.publish_on(&link, &messages).await {
                Err(err) if err.is_transient() && !link.usable() && Instant::now() < deadline => {
                    tracing::warn!(error = %err, "a publish was cut off by a dropped connection; publishing it again");
                }
                done => return done,
            }
        }
    }

    async fn publish_on(&self, link: &Link, messages: &[Outgoing]) -> Result<()> {
        let mut confirms = Vec::with_capacity(messages.len());
        for (exchange, key, body, props) in messages {
            let confirm = link
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
                    body,
                    props.clone(),
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

    /// Up to `max` reservations of `queue`, marked started (a reserve) or not (a
    /// prefetch).
    async fn take_deliveries(
        &self,
        queue: &QueueName,
        max: usize,
        started: bool,
    ) -> Result<Vec<Reservation>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.ensure_queue(queue.as_str()).await?;
        let c = self.consumer(queue.as_str()).await?;
        let claimed = self.claim_on(&c, queue, max, started).await;
        if claimed.is_err() {
            // Deliveries taken on the way would stay unacknowledged: give them all back.
            retire(&c).await;
        }
        claimed
    }

    async fn claim_on(
        &self,
        c: &QueueConsumer,
        queue: &QueueName,
        max: usize,
        started: bool,
    ) -> Result<Vec<Reservation>> {
        let mut deliveries = Self::pull(c, queue, max).await?;
        let mut out = Vec::with_capacity(deliveries.len());
        loop {
            let settled_some = !deliveries.is_empty();
            for d in deliveries {
                if let Some(r) = self.admit(c, d, queue.as_str(), started).await? {
                    out.push(r);
                }
            }
            // Everything taken was settled on the way (malformed, expired, early): look
            // again rather than report an empty queue that may hold more.
            if !out.is_empty() || !settled_some {
                return Ok(out);
            }
            deliveries = Self::pull(c, queue, max).await?;
        }
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
        started: bool,
    ) -> Result<Option<Reservation>> {
        let tag = d.delivery_tag;
        let text = String::from_utf8_lossy(&d.data).into_owned();
        let mut env = match Envelope::from_json(&text) {
            Ok(env) => env,
            Err(err) => {
                self.quarantine(c, d, queue, &err.to_string()).await?;
                return Ok(None);
            }
        };
        if env.queue.as_str() != queue {
            // A shovel, an operator's move or a misbinding put it here. Its lease would
            // be looked up under the queue it names, so no worker of this queue could
            // ever settle it: quarantined here, a replay sends it to its own queue.
            let why = format!(
                "the envelope names queue `{}` but was delivered from queue `{queue}` (moved by a shovel, an operator or a misbinding); replay it to send it to its own queue",
                env.queue
            );
            tracing::warn!(queue, message_id = %env.id, named = %env.queue, "message of another queue quarantined");
            self.quarantine(c, d, queue, &why).await?;
            return Ok(None);
        }
        if let Some(ids) = lock(&self.delayed).get_mut(queue) {
            ids.remove(&env.id);
        }
        let counted = self.deliveries_charged(&d, &env).await;
        let now = Utc::now();
        let early =
            env.available_at > now + chrono::Duration::milliseconds(UNIT.as_millis() as i64 / 2);
        let expired = env.expires_at.is_some_and(|e| e <= now);
        // A classic queue counts no redelivery: publish it again with the attempt counted
        // (with start marks, the control store keeps the count instead).
        let recount = d.redelivered
            && self.options.queue_kind == QueueKind::Classic
            && self.options.control_store.is_none();
        if expired || early || recount {
            let mut again = env;
            again.attempts += counted;
            let (headers, target) = if expired {
                (Some(dead_headers(reason::EXPIRED)), Target::Dead)
            } else {
                (None, Target::Queue)
            };
            self.send(vec![(again, headers, target)]).await?;
            ack_one(c, tag).await;
            return Ok(None);
        }
        env.attempts += counted;
        if started {
            lock(&c.held).insert(tag, true);
        }
        let token = LeaseToken(Uuid::from_u64_pair(c.generation, tag));
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
    async fn quarantine(
        &self,
        c: &QueueConsumer,
        d: Delivery,
        queue: &str,
        why: &str,
    ) -> Result<()> {
        let mut headers = dead_headers(reason::MALFORMED);
        headers.insert(H_ERROR.into(), long_string(&text::error_text(why)));
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = d.properties.message_id() {
            props = props.with_message_id(id.clone());
        }
        let tag = d.delivery_tag;
        self.publish_all(vec![(String::new(), dead_queue(queue), d.data, props)])
            .await?;
        ack_one(c, tag).await;
        Ok(())
    }

    /// Deliveries of the message in `d` that ended without an ack and are not counted in
    /// `env.attempts` yet. Without a control store, what the broker tells
    /// ([`delivery_count`]): every return counts, started or not. With one, a message
    /// that came back counts only the start its mark records (`running` at an attempt
    /// above the envelope's): deliveries a dead consumer merely held are not charged.
    async fn deliveries_charged(&self, d: &Delivery, env: &Envelope) -> u32 {
        let counted = delivery_count(d);
        let Some(store) = &self.options.control_store else {
            return counted;
        };
        if counted == 0 && !d.redelivered {
            return 0;
        }
        marks::charged_returns(store.as_ref(), env, counted).await
    }

    /// Up to `max` deliveries of `queue`: those the consumer received, then ready
    /// messages the broker has not pushed (`basic.get`, which the prefetch does not
    /// limit). An empty `basic.get` does not prove that nothing is on its way to the
    /// consumer (the broker may send deliveries queued for the channel after it), so an
    /// empty pull waits a moment for them: a reserve right after a confirmed publish
    /// finds the message.
    async fn pull(c: &QueueConsumer, queue: &QueueName, max: usize) -> Result<Vec<Delivery>> {
        let mut out = Self::take(c, max);
        while out.len() < max {
            c.getting.fetch_add(1, Ordering::SeqCst);
            let got = c
                .channel
                .basic_get(queue.as_str().into(), BasicGetOptions::default())
                .await;
            if let Ok(Some(m)) = &got {
                lock(&c.held).insert(m.delivery.delivery_tag, false);
            }
            c.getting.fetch_sub(1, Ordering::SeqCst);
            match got.map_err(broker)? {
                Some(m) => out.push(m.delivery),
                None => {
                    out.extend(Self::take(c, max - out.len()));
                    break;
                }
            }
        }
        if out.is_empty() {
            let arrived = c.arrived.notified();
            out = Self::take(c, max);
            if out.is_empty() && tokio::time::timeout(IN_FLIGHT, arrived).await.is_ok() {
                out = Self::take(c, max);
            }
        }
        Ok(out)
    }

    /// The messages this transport delayed on `queue` that have not come out yet (and
    /// are not overdue by more than [`DELAY_GRACE`], when another process took them).
    fn delayed_count(&self, queue: &str) -> u64 {
        let mut delayed = lock(&self.delayed);
        let Some(ids) = delayed.get_mut(queue) else {
            return 0;
        };
        let now = Instant::now();
        ids.retain(|_, until| *until > now);
        ids.len() as u64
    }

    /// Takes up to `max` received deliveries, in order.
    fn take(c: &QueueConsumer, max: usize) -> Vec<Delivery> {
        let mut buffer = lock(&c.buffer);
        Self::fill_upto(c, &mut buffer, max);
        let n = buffer.len().min(max);
        let taken: Vec<Delivery> = buffer.drain(..n).collect();
        // Every unacknowledged delivery is in the buffer or in `held`, so that a
        // multiple ack never covers one in between.
        let mut held = lock(&c.held);
        for d in &taken {
            held.insert(d.delivery_tag, false);
        }
        taken
    }

    /// Moves what lapin received into the buffer; how many the buffer holds.
    fn fill(c: &QueueConsumer) -> usize {
        let mut buffer = lock(&c.buffer);
        Self::fill_upto(c, &mut buffer, usize::MAX);
        buffer.len()
    }

    fn fill_upto(c: &QueueConsumer, buffer: &mut VecDeque<Delivery>, max: usize) {
        let mut direct = lock(&c.direct);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while buffer.len() < max {
            match std::pin::Pin::new(&mut *direct).poll_next(&mut cx) {
                std::task::Poll::Ready(Some(Ok(d))) => buffer.push_back(d),
                std::task::Poll::Ready(_) => {
                    // The consumer ended (cancelled, or its channel closed): `receive`
                    // will not see it now, so tell it.
                    c.closed.store(true, Ordering::SeqCst);
                    c.stop.notify_one();
                    break;
                }
                std::task::Poll::Pending => break,
            }
        }
    }

    /// A channel of its own on the current connection (a refused declaration or get
    /// closes only it).
    async fn channel(&self) -> Result<Channel> {
        self.link()
            .await?
            .conn
            .create_channel()
            .await
            .map_err(broker)
    }

    /// Whether the broker has a queue of this name (a passive declaration, on a channel
    /// of its own since a refused one closes its channel).
    async fn queue_exists(&self, name: &str) -> Result<bool> {
        let ch = self.channel().await?;
        match ch
            .queue_declare(name.into(), passive(), FieldTable::default())
            .await
        {
            Ok(_) => {
                let _ = ch.close(200, "checked".into()).await;
                Ok(true)
            }
            // NOT_FOUND closes the channel.
            Err(err) if matches!(err.kind(), lapin::ErrorKind::ProtocolError(_)) => Ok(false),
            Err(err) => Err(broker(err)),
        }
    }

    /// Reads every message of `queue`'s dead-letter queue on a channel of its own and
    /// returns the channel with the letters `pick` chose (unacknowledged). Closing the
    /// channel gives back what was not acked, in its order. `None` when the broker has
    /// no such queue: reading declares nothing.
    async fn read_dead<F>(&self, queue: &str, mut pick: F) -> Result<Option<DeadRead>>
    where
        F: FnMut(&DeadLetter) -> bool,
    {
        if !self.queue_exists(&dead_queue(queue)).await? {
            return Ok(None);
        }
        self.ensure_queue(queue).await?;
        let ch = self.channel().await?;
        let dead = dead_queue(queue);
        let mut picked = Vec::new();
        let mut read = 0_u32;
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions::default())
            .await
            .map_err(broker)?
        {
            read = read.saturating_add(1);
            let letter = dead_letter_of(&m, queue);
            if pick(&letter) {
                picked.push((m.delivery.delivery_tag, letter));
            }
        }
        Ok(Some(DeadRead {
            channel: ch,
            picked,
            read,
        }))
    }

    /// Closes a dead-letter reading channel, which gives back what it did not ack, and
    /// waits (up to 2 s) until the queue counts those again: a quorum queue takes
    /// returns back after the close, and a `stats` or a listing right after would miss
    /// them.
    async fn put_back_unread(&self, channel: Channel, queue: &str, returned: u32) {
        let _ = channel.close(200, "done".into()).await;
        if returned == 0 || self.options.queue_kind == QueueKind::Classic {
            return;
        }
        let dead = dead_queue(queue);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let Ok(ch) = self.channel().await else { return };
            let counted = ch
                .queue_declare(dead.as_str().into(), passive(), FieldTable::default())
                .await
                .map(|q| q.message_count());
            let _ = ch.close(200, "counted".into()).await;
            match counted {
                Ok(n) if n < returned => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => return,
            }
        }
    }

    /// The queues a command over `queue` (or all queues) acts on. AMQP cannot list a
    /// broker's queues, so "all" means those this transport used, and is an error in a
    /// process that used none (a command-line tool, say).
    fn selected_queues(&self, queue: Option<&QueueName>) -> Result<Vec<String>> {
        match queue {
            Some(q) => Ok(vec![q.as_str().to_owned()]),
            None => {
                let known = self.queues();
                if known.is_empty() {
                    return Err(Error::InvalidInput(
                        "RabbitMQ cannot list its queues over AMQP: name the queue (--queue Q); `rabbitmqctl list_queues` shows them".into(),
                    ));
                }
                Ok(known)
            }
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
        for q in self.selected_queues(queue)? {
            let Some(DeadRead {
                channel: ch,
                picked,
                read,
            }) = self.read_dead(&q, selected).await?
            else {
                continue;
            };
            let mut settled = 0_u32;
            for (tag, letter) in picked {
                if replay {
                    let Some(mut env) = letter.envelope else {
                        // A malformed letter cannot be delivered; it stays.
                        continue;
                    };
                    env.attempts = 0;
                    env.available_at = Utc::now();
                    env.expires_at = None;
                    // It goes to the queue it names, which may not be this one (a
                    // quarantined message of another queue) nor declared yet.
                    self.ensure_queue(env.queue.as_str()).await?;
                    self.send(vec![(env, None, Target::Queue)]).await?;
                }
                ch.basic_ack(tag, BasicAckOptions::default())
                    .await
                    .map_err(broker)?;
                n += 1;
                settled += 1;
            }
            self.put_back_unread(ch, &q, read.saturating_sub(settled))
                .await;
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

/// What a read of a dead-letter queue holds: its channel (with every message read
/// unacknowledged), the letters picked, and how many were read in all.
struct DeadRead {
    channel: Channel,
    picked: Vec<(u64, DeadLetter)>,
    read: u32,
}

/// Where a message is published.
enum Target {
    /// Its queue, through the delay chain when it is not yet due.
    Queue,
    /// Its dead-letter queue.
    Dead,
}

/// A declaration that only asks whether the queue exists (NOT_FOUND closes its channel).
fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    }
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

/// Moves deliveries from the broker into the consumer's buffer until its channel
/// closes or the broker cancels the consumer, waking the queue's idle workers.
async fn receive(
    mut stream: lapin::Consumer,
    c: Arc<QueueConsumer>,
    wakers: Arc<Wakers>,
    link: Arc<Link>,
    queue: String,
) {
    loop {
        // Taken from the stream and buffered under the buffer's lock, so that a reserve
        // never misses a delivery that is between the two.
        let next = std::future::poll_fn(|cx| {
            let mut buffer = lock(&c.buffer);
            match std::pin::Pin::new(&mut stream).poll_next(cx) {
                std::task::Poll::Ready(Some(Ok(d))) => {
                    buffer.push_back(d);
                    std::task::Poll::Ready(true)
                }
                std::task::Poll::Ready(Some(Err(err))) => {
                    tracing::debug!(queue, error = %err, "consumer stopped");
                    std::task::Poll::Ready(false)
                }
                std::task::Poll::Ready(None) => std::task::Poll::Ready(false),
                std::task::Poll::Pending => std::task::Poll::Pending,
            }
        });
        let more = tokio::select! {
            more = next => more,
            () = c.stop.notified() => false,
        };
        if !more || c.closed.load(Ordering::SeqCst) {
            break;
        }
        c.arrived.notify_waiters();
        wakers.wake(&queue);
    }
    // The channel closed, or the broker cancelled the consumer (its queue was deleted,
    // its leader moved): close the channel, so that every delivery it holds goes back
    // to the queue, and declare the queue again before the next consumer starts. The
    // queue is forgotten first: whoever sees this consumer closed (a lost lease) and
    // publishes at once must declare it again, or the publish finds no queue.
    lock(&link.declared).remove(&queue);
    {
        let mut buffer = lock(&c.buffer);
        c.closed.store(true, Ordering::SeqCst);
        buffer.clear();
    }
    if c.channel.status().connected() {
        tracing::info!(
            queue,
            "the broker cancelled the consumer; its deliveries return to the queue"
        );
        let _ = c.channel.close(200, "consumer cancelled".into()).await;
    }
    wakers.wake(&queue);
}

/// Acks one delivery still in `held`; `false` when it was not (settled already) or its
/// channel closed (the broker gives the message to someone else).
async fn ack_one(c: &QueueConsumer, tag: u64) -> bool {
    let _acking = c.acking.lock().await;
    lock(&c.held).remove(&tag).is_some()
        && c.channel
            .basic_ack(tag, BasicAckOptions::default())
            .await
            .is_ok()
}

/// Stops a consumer and closes its channel, so that every delivery it holds returns to
/// the queue (its leases are lost).
async fn retire(c: &QueueConsumer) {
    {
        let mut buffer = lock(&c.buffer);
        c.closed.store(true, Ordering::SeqCst);
        buffer.clear();
    }
    c.stop.notify_one();
    if c.channel.status().connected() {
        let _ = tokio::time::timeout(
            CONNECT_TIMEOUT,
            c.channel.close(200, "consumer retired".into()),
        )
        .await;
    }
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

impl AmqpTransport {
    /// The control store that keeps this transport's start marks, when it has one
    /// ([`AmqpOptions::with_control_store`](crate::AmqpOptions::with_control_store)).
    pub fn control_store(&self) -> Option<Arc<dyn StatusStore>> {
        self.options.control_store.clone()
    }
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
        caps.charges_only_started = self.options.control_store.is_some();
        caps.start_marks_in_status = self.options.control_store.is_some();
        caps
    }

    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
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

    async fn claim(&self, queue: &QueueName, claim: Claim) -> Result<Vec<Reservation>> {
        // Nothing is taken out of the delay chain early: a move's claim (Scope::Any)
        // gets what is due, and no claim starts fresh messages by itself.
        let max = claim.max;
        if claim.start != Start::All {
            return self.take_deliveries(queue, max, false).await;
        }
        if self.options.control_store.is_none() {
            return self.take_deliveries(queue, max, true).await;
        }
        // A reserve starts what it returns: with a control store, that start is marked
        // like a worker's, so a consumer that dies holding it is charged.
        let claimed = self.take_deliveries(queue, max, false).await?;
        match self.start_batch(&claimed).await {
            Ok(report) => Ok(claimed
                .into_iter()
                .filter(|r| !report.lost.contains(&r.id()))
                .map(|mut r| {
                    r.started = true;
                    r
                })
                .collect()),
            Err(err) => {
                for r in &claimed {
                    let _ = self.give_back(r, GiveBack::Unstarted).await;
                }
                Err(err)
            }
        }
    }

    async fn ack_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        let mut report = AckReport::default();
        let mut by_consumer: HashMap<u64, (Arc<QueueConsumer>, Vec<(u64, Uuid)>)> = HashMap::new();
        for r in reservations {
            match self.holder(r) {
                Some(c) => by_consumer
                    .entry(c.generation)
                    .or_insert_with(|| (c.clone(), Vec::new()))
                    .1
                    .push((r.receipt.tag(), r.id())),
                None => report.lost.push(r.id()),
            }
        }
        for (c, mut tags) in by_consumer.into_values() {
            tags.sort_unstable_by_key(|(tag, _)| *tag);
            let _acking = c.acking.lock().await;
            // Taken out of `held` first: a repeated or concurrent ack finds them gone.
            let (mine, floor) = {
                let mut buffer = lock(&c.buffer);
                // What lapin received counts as unacknowledged too.
                Self::fill_upto(&c, &mut buffer, usize::MAX);
                if c.closed.load(Ordering::SeqCst) {
                    // The buffer may be cleared any moment: ack nothing on this channel.
                    report.lost.extend(tags.into_iter().map(|(_, id)| id));
                    continue;
                }
                let mut held = lock(&c.held);
                let mut mine = Vec::with_capacity(tags.len());
                for (tag, id) in tags {
                    if held.remove(&tag).is_some() {
                        mine.push((tag, id));
                    } else {
                        report.lost.push(id);
                    }
                }
                // The oldest delivery left unacknowledged on the channel (none may be
                // acked in one go while a basic.get is on its way).
                let floor = if c.getting.load(Ordering::SeqCst) > 0 {
                    0
                } else {
                    held.keys()
                        .copied()
                        .chain(buffer.front().map(|d| d.delivery_tag))
                        .min()
                        .unwrap_or(u64::MAX)
                };
                (mine, floor)
            };
            // Everything below it goes in one `multiple` ack; the rest one by one.
            let split = mine.partition_point(|(tag, _)| *tag < floor);
            let (below, above) = mine.split_at(split);
            if let Some(&(last, _)) = below.last() {
                let multiple = BasicAckOptions { multiple: true };
                let ok = c.channel.basic_ack(last, multiple).await.is_ok();
                let to = if ok {
                    &mut report.acked
                } else {
                    &mut report.lost
                };
                to.extend(below.iter().map(|(_, id)| *id));
            }
            for &(tag, id) in above {
                if c.channel
                    .basic_ack(tag, BasicAckOptions::default())
                    .await
                    .is_ok()
                {
                    report.acked.push(id);
                } else {
                    report.lost.push(id);
                }
            }
        }
        Ok(report)
    }

    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()> {
        match how {
            GiveBack::Retry { delay, error } => {
                if self.holder(reservation).is_none() {
                    return Err(lost(reservation));
                }
                let mut env = reservation.envelope.clone();
                env.attempts += 1;
                env.available_at =
                    Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
                if let Some(e) = error {
                    // As bounded and NUL-free as on the SQL backends, where the message may move.
                    env.last_error = Some(text::error_text(e));
                }
                self.replace(reservation, (env, None, Target::Queue)).await
            }
            GiveBack::Unstarted => {
                let Some(c) = self.holder(reservation) else {
                    return Err(lost(reservation));
                };
                let started = lock(&c.held)
                    .get(&reservation.receipt.tag())
                    .copied()
                    .unwrap_or(false);
                if let (true, Some(store)) = (started, &self.options.control_store) {
                    marks::close_unrun(store.as_ref(), &reservation.envelope).await;
                }
                self.replace(
                    reservation,
                    (reservation.envelope.clone(), None, Target::Queue),
                )
                .await
            }
        }
    }

    async fn dead_letter(
        &self,
        reservation: &Reservation,
        reason: &str,
        error: Option<&str>,
    ) -> Result<()> {
        let Some(c) = self.holder(reservation) else {
            return Err(lost(reservation));
        };
        let started = lock(&c.held)
            .get(&reservation.receipt.tag())
            .copied()
            .unwrap_or(false);
        let mut env = reservation.envelope.clone();
        env.attempts += u32::from(started);
        if let Some(e) = error {
            // As bounded and NUL-free as on the SQL backends, where the message may move.
            env.last_error = Some(text::error_text(e));
        }
        let headers = dead_headers(&text::reason_text(reason));
        self.replace(reservation, (env, Some(headers), Target::Dead))
            .await
    }

    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        if let Some(store) = &self.options.control_store {
            let held = reservations.iter().filter(|r| self.holder(r).is_some());
            marks::mark_started(store.as_ref(), held.map(|r| &r.envelope)).await?;
        }
        let mut report = AckReport::default();
        for r in reservations {
            let started = self.holder(r).is_some_and(|c| {
                lock(&c.held)
                    .get_mut(&r.receipt.tag())
                    .map(|s| *s = true)
                    .is_some()
            });
            if started {
                report.acked.push(r.id());
            } else {
                report.lost.push(r.id());
            }
        }
        Ok(report)
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
        let queues = self.selected_queues(queue)?;
        let link = self.link().await?;
        let mut out = Vec::new();
        for q in queues {
            let ch = link.conn.create_channel().await.map_err(broker)?;
            let main = match ch
                .queue_declare(q.as_str().into(), passive(), FieldTable::default())
                .await
            {
                Ok(main) => main,
                // A queue never declared has nothing in it (NOT_FOUND).
                Err(err) if matches!(err.kind(), lapin::ErrorKind::ProtocolError(_)) => continue,
                Err(err) => return Err(broker(err)),
            };
            let dead = ch
                .queue_declare(
                    dead_queue(&q).as_str().into(),
                    passive(),
                    FieldTable::default(),
                )
                .await
                .map_err(broker)?;
            let _ = ch.close(200, "done".into()).await;
            let mut s = QueueStats::new(q.as_str());
            // The broker counts only what it has not pushed to a consumer; deliveries
            // this process received and has not handed out are ready all the same.
            let (buffered, held) = self.live_consumer(&q).map_or((0, 0), |c| {
                (lock(&c.buffer).len() as u64, lock(&c.held).len() as u64)
            });
            s.ready = u64::from(main.message_count()) + buffered;
            s.delayed = self.delayed_count(&q);
            s.reserved = held;
            s.dead = u64::from(dead.message_count());
            out.push(s);
        }
        Ok(out)
    }
}

#[async_trait]
impl DeadLetters for AmqpTransport {
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        let mut outgoing = Vec::with_capacity(letters.len());
        for letter in letters {
            self.ensure_queue(&letter.queue).await?;
            let mut headers = FieldTable::default();
            headers.insert(
                H_REASON.into(),
                long_string(&text::reason_text(&letter.reason)),
            );
            headers.insert(
                H_DEAD_AT.into(),
                AMQPValue::LongLongInt(letter.dead_at.timestamp_millis()),
            );
            let body = match &letter.envelope {
                Some(env) => {
                    let mut env = env.clone();
                    env.attempts = letter.attempts;
                    env.last_error = letter.last_error.as_deref().map(text::error_text);
                    env.to_json()
                }
                None => {
                    if let Some(e) = &letter.last_error {
                        headers.insert(H_ERROR.into(), long_string(&text::error_text(e)));
                    }
                    letter.raw.clone().unwrap_or_default()
                }
            };
            let mut props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(letter.id.as_str().into())
                .with_headers(headers);
            // A malformed letter's raw text is kept as it was, of no known type.
            if letter.envelope.is_some() {
                props = props.with_content_type("application/json".into());
            }
            outgoing.push((
                String::new(),
                dead_queue(&letter.queue),
                body.into_bytes(),
                props,
            ));
        }
        self.publish_all(outgoing).await?;
        Ok(letters.len() as u64)
    }

    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut out = Vec::new();
        for q in self.selected_queues(queue)? {
            let Some(DeadRead {
                channel, picked, ..
            }) = self.read_dead(&q, |_| true).await?
            else {
                continue;
            };
            let returned = u32::try_from(picked.len()).unwrap_or(u32::MAX);
            self.put_back_unread(channel, &q, returned).await;
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
