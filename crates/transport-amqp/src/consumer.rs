//! The consumer of one queue: its channel, the deliveries the broker pushed and the
//! reserves have not taken yet (the buffer), those taken and not settled (`held`), the
//! `basic.get`s that pull what the broker has not pushed, the acks (one at a time, so
//! that a `multiple` ack never covers a tag another is about to name), and retiring it,
//! which gives back everything it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Channel;
use queue_core::sql::Wakers;
use queue_core::{AckReport, Result};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::error::{broker, lock};
use crate::gate::KeyGate;
use crate::link::{Link, CONNECT_TIMEOUT};
use crate::topology::passive;

/// How long an empty reserve waits for deliveries on their way to the consumer.
const IN_FLIGHT: Duration = Duration::from_millis(5);
/// How long a new consumer waits for the broker's first pushes.
const WARM_UP: Duration = Duration::from_millis(200);

/// The consumer of one queue: its channel, its generation, and the deliveries it has
/// received but not yet handed out.
pub(crate) struct QueueConsumer {
    pub(crate) generation: u64,
    /// The broker queue it consumes.
    pub(crate) queue: String,
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
    /// A partition's consumer (a single active consumer): its key gate. `basic.get`
    /// would bypass the single active consumer, so it only takes what is pushed.
    pub(crate) gate: Option<KeyGate>,
    /// One claim at a time on a partition's consumer: deliveries must reach the gate in
    /// the order they were delivered, and admitting one may wait (a control store
    /// lookup) while a concurrent claim would offer a later one of the same key first.
    pub(crate) claiming: tokio::sync::Mutex<()>,
    prefetch: u16,
}

impl QueueConsumer {
    /// Starts consuming `queue` on a new channel of `link`, with the next of
    /// `generation`, and the task that receives its deliveries; with how many messages
    /// the queue had ready.
    pub(crate) async fn open(
        link: Arc<Link>,
        prefetch: u16,
        generation: &AtomicU64,
        wakers: Arc<Wakers>,
        queue: &str,
        logical: &str,
    ) -> Result<(Arc<QueueConsumer>, u32)> {
        let channel = link.conn.create_channel().await.map_err(broker)?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
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
            generation: generation.fetch_add(1, Ordering::SeqCst),
            queue: queue.to_owned(),
            channel,
            buffer: Mutex::default(),
            held: Mutex::default(),
            direct: Mutex::new(stream.clone()),
            stop: Notify::new(),
            arrived: Notify::new(),
            acking: tokio::sync::Mutex::default(),
            getting: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            gate: (queue != logical).then(KeyGate::default),
            claiming: tokio::sync::Mutex::default(),
            prefetch,
        });
        tokio::spawn(receive(
            stream,
            consumer.clone(),
            wakers,
            link,
            (queue.to_owned(), logical.to_owned()),
        ));
        Ok((consumer, ready))
    }

    /// Waits (up to [`WARM_UP`]) for the broker's first pushes, until the buffer holds
    /// `expect` deliveries.
    pub(crate) async fn warm_up(&self, expect: usize) {
        let deadline = Instant::now() + WARM_UP;
        while self.fill() < expect && self.live() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    pub(crate) fn live(&self) -> bool {
        !self.closed.load(Ordering::SeqCst) && self.channel.status().connected()
    }

    /// Whether `tag` is a delivery this consumer handed out and holds unsettled.
    pub(crate) fn holds(&self, tag: u64) -> bool {
        lock(&self.held).contains_key(&tag)
    }

    /// Whether a handler started the held delivery `tag` (`start_batch`).
    pub(crate) fn started(&self, tag: u64) -> bool {
        lock(&self.held).get(&tag).copied().unwrap_or(false)
    }

    /// Records that a handler starts the held delivery `tag`; `false` when it is not held.
    pub(crate) fn mark_started(&self, tag: u64) -> bool {
        lock(&self.held).get_mut(&tag).map(|s| *s = true).is_some()
    }

    /// Holds the delivery `tag`, started or not.
    pub(crate) fn hold(&self, tag: u64, started: bool) {
        lock(&self.held).insert(tag, started);
    }

    /// The deliveries received and not handed out, and those held.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            lock(&self.buffer).len() as u64,
            lock(&self.held).len() as u64,
        )
    }

    /// Up to `max` deliveries of `queue`: those the consumer received, then (except on a
    /// partition, where it would bypass the single active consumer) ready messages the
    /// broker has not pushed (`basic.get`, which the prefetch does not limit). An empty `basic.get` does not prove that nothing is on its way to the
    /// consumer (the broker may send deliveries queued for the channel after it), so an
    /// empty pull waits a moment for them: a reserve right after a confirmed publish
    /// finds the message.
    ///
    /// A worker's `prefetch` that finds deliveries waiting returns them without asking
    /// for more while the consumer holds fewer than its prefetch: the broker pushes
    /// whatever else is ready, and a worker woken by one delivery starts it without a
    /// round trip first.
    pub(crate) async fn pull(
        &self,
        queue: &str,
        max: usize,
        prefetch: bool,
    ) -> Result<Vec<Delivery>> {
        let mut out = self.take(max);
        let pushing =
            prefetch && !out.is_empty() && lock(&self.held).len() < usize::from(self.prefetch);
        while out.len() < max && self.gate.is_none() && !pushing {
            self.getting.fetch_add(1, Ordering::SeqCst);
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions::default())
                .await;
            if let Ok(Some(m)) = &got {
                lock(&self.held).insert(m.delivery.delivery_tag, false);
            }
            self.getting.fetch_sub(1, Ordering::SeqCst);
            match got.map_err(broker)? {
                Some(m) => out.push(m.delivery),
                None => {
                    out.extend(self.take(max - out.len()));
                    break;
                }
            }
        }
        if out.is_empty() {
            let arrived = self.arrived.notified();
            out = self.take(max);
            if out.is_empty() && tokio::time::timeout(IN_FLIGHT, arrived).await.is_ok() {
                out = self.take(max);
            }
        }
        Ok(out)
    }

    /// Takes up to `max` received deliveries, in order.
    fn take(&self, max: usize) -> Vec<Delivery> {
        let mut buffer = lock(&self.buffer);
        self.fill_upto(&mut buffer, max);
        let n = buffer.len().min(max);
        let taken: Vec<Delivery> = buffer.drain(..n).collect();
        // Every unacknowledged delivery is in the buffer or in `held`, so that a
        // multiple ack never covers one in between.
        let mut held = lock(&self.held);
        for d in &taken {
            held.insert(d.delivery_tag, false);
        }
        taken
    }

    /// Moves what lapin received into the buffer; how many the buffer holds.
    fn fill(&self) -> usize {
        let mut buffer = lock(&self.buffer);
        self.fill_upto(&mut buffer, usize::MAX);
        buffer.len()
    }

    fn fill_upto(&self, buffer: &mut VecDeque<Delivery>, max: usize) {
        let mut direct = lock(&self.direct);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while buffer.len() < max {
            match std::pin::Pin::new(&mut *direct).poll_next(&mut cx) {
                std::task::Poll::Ready(Some(Ok(d))) => buffer.push_back(d),
                std::task::Poll::Ready(_) => {
                    // The consumer ended (cancelled, or its channel closed): `receive`
                    // will not see it now, so tell it.
                    self.closed.store(true, Ordering::SeqCst);
                    self.stop.notify_one();
                    break;
                }
                std::task::Poll::Pending => break,
            }
        }
    }

    /// Waits until the broker has processed every ack sent on this channel before now:
    /// AMQP does not answer an ack, so a synchronous method (`basic.qos`, restating the
    /// prefetch) is the barrier; the broker handles a channel's frames in order. `false`
    /// when the channel closed, and the acks may not have counted.
    pub(crate) async fn acks_processed(&self) -> bool {
        self.channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .is_ok()
    }

    /// Acks `tags` (with their messages' ids) on this consumer's channel, adding each to
    /// the acked or the lost of `report`.
    pub(crate) async fn ack_batch(&self, mut tags: Vec<(u64, Uuid)>, report: &mut AckReport) {
        tags.sort_unstable_by_key(|(tag, _)| *tag);
        let _acking = self.acking.lock().await;
        // Taken out of `held` first: a repeated or concurrent ack finds them gone.
        let (mine, floor) = {
            let mut buffer = lock(&self.buffer);
            // What lapin received counts as unacknowledged too.
            self.fill_upto(&mut buffer, usize::MAX);
            if self.closed.load(Ordering::SeqCst) {
                // The buffer may be cleared any moment: ack nothing on this channel.
                report.lost.extend(tags.into_iter().map(|(_, id)| id));
                return;
            }
            let mut held = lock(&self.held);
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
            let floor = if self.getting.load(Ordering::SeqCst) > 0 {
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
            let ok = self.channel.basic_ack(last, multiple).await.is_ok();
            let to = if ok {
                &mut report.acked
            } else {
                &mut report.lost
            };
            to.extend(below.iter().map(|(_, id)| *id));
        }
        for &(tag, id) in above {
            if self
                .channel
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
}

/// Moves deliveries from the broker into the consumer's buffer until its channel
/// closes or the broker cancels the consumer, waking the idle workers of the logical
/// queue (`names`: the broker queue, and the logical queue it belongs to).
async fn receive(
    mut stream: lapin::Consumer,
    c: Arc<QueueConsumer>,
    wakers: Arc<Wakers>,
    link: Arc<Link>,
    names: (String, String),
) {
    let (queue, logical) = names;
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
        wakers.wake(&logical);
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
    wakers.wake(&logical);
}

/// Acks one delivery still in `held`; `false` when it was not (settled already) or its
/// channel closed (the broker gives the message to someone else).
pub(crate) async fn ack_one(c: &QueueConsumer, tag: u64) -> bool {
    let _acking = c.acking.lock().await;
    lock(&c.held).remove(&tag).is_some()
        && c.channel
            .basic_ack(tag, BasicAckOptions::default())
            .await
            .is_ok()
}

/// Stops a consumer and closes its channel, so that every delivery it holds returns to
/// the queue (its leases are lost).
pub(crate) async fn retire(c: &QueueConsumer) {
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
