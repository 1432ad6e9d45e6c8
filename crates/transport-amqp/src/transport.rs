//! The transport: [`AmqpTransport`], which composes the connector, the declared queues,
//! the publisher and the consumers, and its [`Transport`] methods. Its dead-letter
//! methods are in the `dead` module.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use queue_core::status::StatusStore;
use queue_core::{
    text, AckReport, Capabilities, Claim, Envelope, GiveBack, Published, QueueName, QueueStats,
    Reservation, Result, Start, Transport, UniqueKeyStore,
};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::claim::Claimer;
use crate::codec::dead_headers;
use crate::consumer::{retire, QueueConsumer};
use crate::consumers::Consumers;
use crate::error::{broker, lock, lost, TRANSPORT};
use crate::link::Connector;
use crate::marks;
use crate::options::{AmqpOptions, QueueKind};
use crate::publish::{publish_all, Publisher, Target};
use crate::queues::{queue_exists, Queues};
use crate::topology::{dead_queue, partition_name, passive, physical_queue, PARTITIONS};
use crate::unique;

mod returns;

/// RabbitMQ over AMQP 0-9-1.
///
/// Each logical queue is a durable queue of its own name (quorum by default, classic
/// with priorities as an option) with a dead-letter queue `<queue>.dead`, and, once a
/// message with an ordering key is published to it, 8 partition queues `<queue>~k<n>`
/// with a single active consumer each (see the `gate` module); delays go
/// through a fixed chain of TTL queues (see the `topology` module). Publishes wait for
/// the broker's confirms, pipelined within a batch. Reserves take deliveries from a
/// consumer with a bounded prefetch; a lease is a delivery, and its token is the
/// delivery tag together with the generation of the consumer's channel, so an ack after
/// the channel was replaced fails with [`Error::LeaseLost`](queue_core::Error::LeaseLost)
/// instead of acking another message. A lease has no expiry of its own: when a
/// consumer's channel closes (its process died, the broker's consumer timeout, a
/// cancel), the broker delivers its messages again, and the delivery counts an attempt.
///
/// When the connection drops (a broker restart, a network fault), the next operation
/// reconnects with backoff for up to [`AmqpOptions::reconnect_timeout`], declares the
/// topology again and starts new consumers; a publish cut off on the way is published
/// again (at least once), and leases of the old connection are lost.
pub struct AmqpTransport {
    /// The options, the broker's nodes and the live connection.
    pub(crate) connector: Connector,
    pub(crate) queues: Queues,
    pub(crate) publisher: Publisher,
    consumers: Consumers,
    /// Per logical queue: whether it has partitions (`None`: yes), or when it was last
    /// found without them.
    partitions: Mutex<HashMap<String, Option<Instant>>>,
    next_partition: AtomicU64,
    /// Where messages' unique keys live: the control store's key table.
    unique_keys: Option<Arc<dyn UniqueKeyStore>>,
    /// When key rows that hold nothing were last deleted.
    keys_pruned: Mutex<Option<Instant>>,
}

/// How often a queue without partitions is looked at again for them: the first keyed
/// message published by another process is found within this. The look is a passive
/// declaration, which the broker logs as a channel error when the queue is missing, so
/// it is not made on every claim.
const PARTITION_CHECK: Duration = Duration::from_secs(30);

impl fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("url", &self.options().url)
            .field("queue_kind", &self.options().queue_kind)
            .finish_non_exhaustive()
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
        let unique_keys = options
            .control_store
            .as_ref()
            .and_then(|store| store.unique_keys());
        let connector = Connector::connect(options).await?;
        Ok(AmqpTransport {
            unique_keys,
            keys_pruned: Mutex::default(),
            connector,
            queues: Queues::default(),
            publisher: Publisher::default(),
            consumers: Consumers::new(),
            partitions: Mutex::default(),
            next_partition: AtomicU64::new(0),
        })
    }

    /// Closes the connection; deliveries held unacknowledged go back to their queues.
    pub async fn close(&self) {
        self.connector.close().await;
    }

    /// Publishes `body` as it is (not an envelope) to `queue`, with `id` as its message
    /// id: for tests and tools that need a message the transport did not encode.
    #[doc(hidden)]
    pub async fn publish_raw(&self, queue: &QueueName, id: &str, body: &str) -> Result<()> {
        self.queues.ensure(&self.connector, queue.as_str()).await?;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.into());
        publish_all(
            &self.connector,
            vec![(
                String::new(),
                queue.as_str().to_owned(),
                body.as_bytes().to_vec(),
                props,
            )],
        )
        .await
    }

    /// Deletes `queue` and its dead-letter queue, messages and all.
    pub async fn delete_queue(&self, queue: &QueueName) -> Result<()> {
        self.queues.delete(&self.connector, queue).await?;
        lock(&self.partitions).remove(queue.as_str());
        Ok(())
    }

    /// The queues this transport declared (the dead-letter queues not listed).
    #[doc(hidden)]
    pub fn queues(&self) -> Vec<String> {
        self.queues.names()
    }

    /// The node of the current connection, as `host:port`: for operators and tests
    /// that follow a cluster's failover.
    pub fn connected_node(&self) -> String {
        self.connector.connected_node()
    }

    /// The control store that keeps this transport's start marks, when it has one
    /// ([`AmqpOptions::with_control_store`](crate::AmqpOptions::with_control_store)).
    pub fn control_store(&self) -> Option<Arc<dyn StatusStore>> {
        self.options().control_store.clone()
    }

    /// Deletes the control store's key rows that hold nothing, at most once a minute
    /// (publishers of unique keys pace it); a failure is logged.
    async fn prune_keys_now_and_then(&self) {
        let Some(keys) = &self.unique_keys else {
            return;
        };
        {
            let mut last = lock(&self.keys_pruned);
            if last.is_some_and(|t| t.elapsed() < unique::PRUNE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(err) = keys.prune(queue_core::sql::unique::PRUNE_AFTER).await {
            tracing::warn!(error = %err, "deleting unique keys that hold nothing failed; retrying later");
        }
    }

    pub(crate) fn options(&self) -> &AmqpOptions {
        self.connector.options()
    }

    /// Up to `max` reservations of `queue`, marked started (a reserve) or not (a
    /// prefetch): from its partitions first, when it has them (at most one message of a
    /// key at a time), then from the queue itself. A worker's `prefetch` takes the
    /// deliveries waiting without asking the broker for more (it claims again at once).
    async fn take_deliveries(
        &self,
        queue: &QueueName,
        max: usize,
        started: bool,
        prefetch: bool,
    ) -> Result<Vec<Reservation>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let q = queue.as_str();
        self.queues.ensure(&self.connector, q).await?;
        let mut out = Vec::new();
        if self.partitioned(q).await? {
            self.queues.ensure_partitions(&self.connector, q).await?;
            // A different first partition each time, so that none waits behind the others.
            let first = self.next_partition.fetch_add(1, Ordering::Relaxed);
            for i in 0..PARTITIONS {
                if out.len() >= max {
                    break;
                }
                let name = partition_name(q, (first + i) % PARTITIONS);
                match self
                    .take_from(&name, q, max - out.len(), started, prefetch)
                    .await
                {
                    Ok(taken) => out.extend(taken),
                    // What other partitions handed out is held: return it, not the error.
                    Err(err) if !out.is_empty() => {
                        tracing::warn!(queue = name, error = %err, "a partition's claim failed");
                        return Ok(out);
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        if out.len() < max {
            match self
                .take_from(q, q, max - out.len(), started, prefetch)
                .await
            {
                Ok(taken) => out.extend(taken),
                Err(err) if !out.is_empty() => {
                    tracing::warn!(queue = q, error = %err, "a claim failed");
                }
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    /// Up to `max` reservations from the consumer of the broker queue `name` of the
    /// logical queue `queue`.
    async fn take_from(
        &self,
        name: &str,
        queue: &str,
        max: usize,
        started: bool,
        prefetch: bool,
    ) -> Result<Vec<Reservation>> {
        let c = self.consumer_of(name, queue).await?;
        let claimer = Claimer {
            connector: &self.connector,
            publisher: &self.publisher,
            consumer: &c,
            prefetch,
        };
        let claimed = claimer.claim(name, queue, max, started).await;
        if claimed.is_err() {
            // Deliveries taken on the way would stay unacknowledged: give them all back.
            retire(&c).await;
        }
        claimed
    }

    /// The consumer of the broker queue `name`, started when needed. A quorum queue
    /// just declared may not have elected its leader yet, and RabbitMQ (3.10 at least)
    /// answers a consume then by failing the channel and the connection
    /// (`{badmatch,{error,noproc}}` in the broker's log): such a transient failure is
    /// tried again, on a new connection, a few times.
    async fn consumer_of(&self, name: &str, queue: &str) -> Result<Arc<QueueConsumer>> {
        let mut pause = Duration::from_millis(50);
        for _ in 0..3 {
            match self.consumers.get(&self.connector, name, queue).await {
                Err(err) if err.is_transient() => {
                    tracing::debug!(queue = name, error = %err, "starting a consumer failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                done => return done,
            }
        }
        self.consumers.get(&self.connector, name, queue).await
    }

    /// Whether `queue` has partition queues (a message with an ordering key was
    /// published to it, by any process): known for good once seen, and looked up again
    /// at most every [`PARTITION_CHECK`] while not.
    async fn partitioned(&self, queue: &str) -> Result<bool> {
        let first = partition_name(queue, 0);
        if lock(&self.connector.link().await?.declared).contains(&first) {
            return Ok(true);
        }
        match lock(&self.partitions).get(queue) {
            Some(None) => return Ok(true),
            Some(Some(at)) if at.elapsed() < PARTITION_CHECK => return Ok(false),
            _ => {}
        }
        let exists = queue_exists(&self.connector, &first).await?;
        lock(&self.partitions).insert(queue.to_owned(), (!exists).then(Instant::now));
        Ok(exists)
    }
}

/// Why a RabbitMQ claim cannot select labels.
const LABELS_UNSUPPORTED: &str = "RabbitMQ cannot claim by label: a queue hands its messages \
    to consumers in its own order, so a consumer cannot pass over the ones it does not want \
    (and routing each label to a queue of its own would deliver a message with two labels \
    twice); give that work a queue of its own";

/// Why RabbitMQ cannot list held messages.
const HOLDINGS_UNSUPPORTED: &str = "RabbitMQ does not say which consumer holds which \
    message: `rabbitmqctl list_consumers` shows each consumer's connection, named \
    `switchyard host:pid`, and `switchyard job ID` the worker of a running job";

#[async_trait]
impl queue_core::Holdings for AmqpTransport {
    async fn held(
        &self,
        _which: queue_core::HeldSelection<'_>,
        _limit: usize,
    ) -> Result<Vec<queue_core::Holding>> {
        Err(queue_core::Error::NotSupported(HOLDINGS_UNSUPPORTED.into()))
    }
}

#[async_trait]
impl Transport for AmqpTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.priorities = self.options().queue_kind == QueueKind::Classic;
        caps.expiry = true;
        caps.wake_signal = true;
        caps.max_payload_bytes = self.options().max_payload_bytes;
        caps.ordering_keys = true;
        caps.charges_only_started = self.options().control_store.is_some();
        caps.start_marks_in_status = self.options().control_store.is_some();
        caps.checkpoints = caps.start_marks_in_status;
        caps.unique_keys = self.unique_keys.is_some();
        caps.limits = self
            .options()
            .control_store
            .as_ref()
            .is_some_and(|store| store.limits().is_some());
        caps
    }

    fn wake_signal(&self, queue: &QueueName) -> Option<Arc<Notify>> {
        Some(self.connector.wakers().get(queue.as_str()))
    }

    async fn publish_batch(&self, mut envelopes: Vec<Envelope>) -> Result<Published> {
        for env in &mut envelopes {
            // Labels travel in the envelope, checked as on every backend.
            env.normalize_for_store()?;
            env.check_size(self.options().max_payload_bytes)?;
        }
        let keyed: HashSet<&str> = envelopes
            .iter()
            .filter(|e| e.ordering_key.is_some())
            .map(|e| e.queue.as_str())
            .collect();
        let queues: HashSet<&str> = envelopes.iter().map(|e| e.queue.as_str()).collect();
        for q in queues {
            if keyed.contains(q) {
                self.queues.ensure_partitions(&self.connector, q).await?;
            } else {
                self.queues.ensure(&self.connector, q).await?;
            }
        }
        // Keys are taken once the queues exist, so that their confirm window is spent on
        // the send alone (a reconnect waited on above cannot eat into it).
        let taken = unique::take_keys(
            self.unique_keys.as_ref(),
            &mut envelopes,
            self.options().reconnect_timeout + self.options().confirm_timeout * 2,
        )
        .await?;
        if !taken.keyed.is_empty() || !taken.duplicates.is_empty() {
            self.prune_keys_now_and_then().await;
        }
        if envelopes.is_empty() {
            let mut published = Published::all_stored();
            published.duplicates = taken.duplicates;
            return Ok(published);
        }
        let sent = self
            .publisher
            .send(
                &self.connector,
                envelopes
                    .into_iter()
                    .map(|e| (e, None, Target::Queue))
                    .collect(),
            )
            .await;
        unique::settle(self.unique_keys.as_ref(), &taken, sent.is_ok()).await;
        sent?;
        let mut published = Published::all_stored();
        published.duplicates = taken.duplicates;
        Ok(published)
    }

    async fn claim(&self, queue: &QueueName, claim: Claim<'_>) -> Result<Vec<Reservation>> {
        if !claim.labels.is_empty() {
            return Err(queue_core::Error::NotSupported(LABELS_UNSUPPORTED.into()));
        }
        // Nothing is taken out of the delay chain early: a move's claim (Scope::Any)
        // gets what is due, and no claim starts fresh messages by itself.
        let max = claim.max;
        if claim.start != Start::All {
            return self.take_deliveries(queue, max, false, true).await;
        }
        if self.options().control_store.is_none() {
            return self.take_deliveries(queue, max, true, false).await;
        }
        // A reserve starts what it returns: with a control store, that start is marked
        // like a worker's, so a consumer that dies holding it is charged.
        let claimed = self.take_deliveries(queue, max, false, false).await?;
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
        if let Some(keys) = &self.unique_keys {
            // Only for deliveries this process still holds (a closed channel's are
            // redelivered, not done).
            let held: Vec<&Reservation> = reservations
                .iter()
                .filter(|r| r.envelope.unique.is_some() && self.consumers.holder(r).is_some())
                .collect();
            if !held.is_empty() {
                unique::acking(keys.as_ref(), &held).await?;
            }
        }
        let mut report = AckReport::default();
        let mut by_consumer: HashMap<u64, (Arc<QueueConsumer>, Vec<(u64, Uuid)>)> = HashMap::new();
        for r in reservations {
            match self.consumers.holder(r) {
                Some(c) => by_consumer
                    .entry(c.generation)
                    .or_insert_with(|| (c.clone(), Vec::new()))
                    .1
                    .push((r.receipt.tag(), r.id())),
                None => report.lost.push(r.id()),
            }
        }
        let mut gated = Vec::new();
        for (c, tags) in by_consumer.into_values() {
            c.ack_batch(tags, &mut report).await;
            if c.gate.is_some() {
                gated.push(c);
            }
        }
        // Each acked head of a key lets the key's next message go out, once the broker
        // has the ack: were the process to die with the ack unsent, the head would come
        // back after its successor had started.
        for c in gated {
            let Some(gate) = &c.gate else { continue };
            if !c.acks_processed().await {
                continue;
            }
            for r in reservations {
                let Some(key) = &r.envelope.ordering_key else {
                    continue;
                };
                let mine = physical_queue(&r.envelope) == c.queue.as_str();
                if mine && report.acked.contains(&r.id()) {
                    gate.release(key);
                    self.connector.wakers().wake(r.envelope.queue.as_str());
                }
            }
        }
        Ok(report)
    }

    async fn give_back(&self, reservation: &Reservation, how: GiveBack<'_>) -> Result<()> {
        match how {
            GiveBack::Retry { delay, error } => self.comes_back(reservation, delay, 1, error).await,
            GiveBack::Snooze { delay } => {
                let Some(c) = self.consumers.holder(reservation) else {
                    return Err(lost(reservation));
                };
                // Not charged: a copy that later returns from a closed channel must not
                // be charged for this start either.
                let started = c.started(reservation.receipt.tag());
                if let (true, Some(store)) = (started, &self.options().control_store) {
                    marks::close_unrun(store.as_ref(), &reservation.envelope).await;
                }
                self.comes_back(reservation, delay, 0, None).await
            }
            GiveBack::Unstarted => {
                let Some(c) = self.consumers.holder(reservation) else {
                    return Err(lost(reservation));
                };
                let started = c.started(reservation.receipt.tag());
                if let (true, Some(store)) = (started, &self.options().control_store) {
                    marks::close_unrun(store.as_ref(), &reservation.envelope).await;
                }
                if let (Some(gate), Some(_)) = (&c.gate, &reservation.envelope.ordering_key) {
                    // First of its key again, here or (when the channel closes) at the broker.
                    self.put_back(&c, gate, reservation);
                    return Ok(());
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
        let Some(c) = self.consumers.holder(reservation) else {
            return Err(lost(reservation));
        };
        if let Some(keys) = &self.unique_keys {
            unique::free_keys(keys.as_ref(), std::iter::once(reservation)).await?;
        }
        let started = c.started(reservation.receipt.tag());
        let mut env = reservation.envelope.clone();
        env.attempts += u32::from(started);
        if let Some(e) = error {
            // As bounded and NUL-free as on the SQL backends, where the message may move.
            env.last_error = Some(text::error_text(e));
        }
        let headers = dead_headers(&text::reason_text(reason));
        let replaced = self
            .replace(reservation, (env, Some(headers), Target::Dead))
            .await;
        if let (Err(err), Some(gate)) = (&replaced, &c.gate) {
            // The dead letter was not stored and the delivery is still held: a worker
            // waits for a lease to run out, which a delivery never does. Its key's head
            // goes out again instead (and fails its way back here), rather than holding
            // the key until the channel closes.
            if !matches!(err, queue_core::Error::LeaseLost { .. })
                && c.holds(reservation.receipt.tag())
            {
                self.put_back(&c, gate, reservation);
            }
        }
        replaced?;
        // The key moves on without it (the dead letter records that it broke the key),
        // once the broker has the ack (see `ack_batch`).
        if let (Some(gate), Some(key)) = (&c.gate, &reservation.envelope.ordering_key) {
            if !c.acks_processed().await {
                return Ok(());
            }
            gate.release(key);
            self.connector
                .wakers()
                .wake(reservation.envelope.queue.as_str());
        }
        Ok(())
    }

    async fn start_batch(&self, reservations: &[Reservation]) -> Result<AckReport> {
        if let Some(store) = &self.options().control_store {
            let held = reservations
                .iter()
                .filter(|r| self.consumers.holder(r).is_some());
            marks::mark_started(store.as_ref(), held.clone().map(|r| &r.envelope)).await?;
            if let Some(keys) = &self.unique_keys {
                unique::free_keys(keys.as_ref(), held.filter(|r| unique::pending_scope(r))).await?;
            }
        }
        let mut report = AckReport::default();
        for r in reservations {
            let started = self
                .consumers
                .holder(r)
                .is_some_and(|c| c.mark_started(r.receipt.tag()));
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
        if self.consumers.holder(reservation).is_some() {
            Ok(())
        } else {
            Err(lost(reservation))
        }
    }

    async fn stats(&self, queue: Option<&QueueName>) -> Result<Vec<QueueStats>> {
        let queues = self.queues.selected(queue)?;
        let link = self.connector.link().await?;
        let mut out = Vec::new();
        for q in queues {
            let ch = link.conn.create_channel().await.map_err(broker)?;
            let main = match ch
                .queue_declare(q.as_str().into(), passive(), FieldTable::default())
                .await
            {
                Ok(main) => main,
                // A queue never declared has nothing in it (NOT_FOUND).
                Err(err) if crate::error::not_found(&err) => continue,
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
            let mut s = QueueStats::new(q.as_str());
            // The broker counts only what it has not pushed to a consumer; deliveries
            // this process received and has not handed out are ready all the same.
            let (buffered, held) = self.consumers.live(&q).map_or((0, 0), |c| c.counts());
            s.ready = u64::from(main.message_count()) + buffered;
            s.delayed = self.publisher.delayed_count(&q);
            s.reserved = held;
            s.dead = u64::from(dead.message_count());
            if self.partitioned(&q).await? {
                for n in 0..PARTITIONS {
                    let name = partition_name(&q, n);
                    let Ok(p) = ch
                        .queue_declare(name.as_str().into(), passive(), FieldTable::default())
                        .await
                    else {
                        // Gone (NOT_FOUND closes the channel): nothing more to count.
                        break;
                    };
                    s.ready += u64::from(p.message_count());
                    if let Some(c) = self.consumers.live(&name) {
                        let (buffered, held) = c.counts();
                        // Parked behind a key's head: ready; a head awaiting its retry:
                        // delayed; the rest held by handlers.
                        let (parked, retrying) = c.gate.as_ref().map_or((0, 0), |g| g.counts());
                        s.ready += buffered + parked;
                        s.delayed += retrying;
                        s.reserved += held.saturating_sub(parked + retrying);
                    }
                }
            }
            let _ = ch.close(200, "done".into()).await;
            out.push(s);
        }
        Ok(out)
    }
}
