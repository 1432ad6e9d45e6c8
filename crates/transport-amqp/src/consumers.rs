//! The consumers of the transport's queues: one live [`QueueConsumer`] per queue,
//! started when a reserve first needs it and again (with a new generation) after its
//! channel closed, and the lease of a reservation, which is its consumer still holding
//! its delivery.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use queue_core::{Reservation, Result};
use uuid::Uuid;

use crate::consumer::{ack_one, retire, QueueConsumer};
use crate::error::lock;
use crate::link::Connector;
use crate::topology::physical_queue;

/// The consumer of each queue.
pub(crate) struct Consumers {
    map: Mutex<HashMap<String, Arc<QueueConsumer>>>,
    /// One consumer start at a time.
    starting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

impl Consumers {
    pub(crate) fn new() -> Self {
        Consumers {
            map: Mutex::default(),
            starting: tokio::sync::Mutex::default(),
            // A random start, so that a token of another transport never matches.
            generation: AtomicU64::new(Uuid::new_v4().as_u64_pair().0 >> 1),
        }
    }

    /// The live consumer of the broker queue `queue` (of the logical queue `logical`:
    /// itself, or one of its partitions), started (again, with a new generation) when
    /// there is none or its channel closed.
    pub(crate) async fn get(
        &self,
        connector: &Connector,
        queue: &str,
        logical: &str,
    ) -> Result<Arc<QueueConsumer>> {
        if let Some(c) = self.live(queue) {
            return Ok(c);
        }
        // One start at a time: two would leave one consumer, and what it holds, orphaned.
        let _one = self.starting.lock().await;
        if let Some(c) = self.live(queue) {
            return Ok(c);
        }
        let replaced = lock(&self.map).remove(queue);
        if let Some(old) = replaced {
            retire(&old).await;
        }
        let link = connector.link().await?;
        let prefetch = connector.options().prefetch;
        let wakers = connector.wakers().clone();
        let (consumer, ready) =
            QueueConsumer::open(link, prefetch, &self.generation, wakers, queue, logical).await?;
        lock(&self.map).insert(queue.to_owned(), consumer.clone());
        consumer
            .warm_up(ready.min(u32::from(prefetch)) as usize)
            .await;
        Ok(consumer)
    }

    pub(crate) fn live(&self, queue: &str) -> Option<Arc<QueueConsumer>> {
        lock(&self.map).get(queue).filter(|c| c.live()).cloned()
    }

    /// The consumer that handed out `r`, if it still holds it: the lease.
    pub(crate) fn holder(&self, r: &Reservation) -> Option<Arc<QueueConsumer>> {
        let (generation, tag) = r.token().0.as_u64_pair();
        let c = self.live(&physical_queue(&r.envelope))?;
        let held = c.generation == generation && tag == r.receipt.tag() && c.holds(tag);
        held.then_some(c)
    }

    /// Acks the delivery behind `r` on its consumer's channel; `false` when the lease
    /// is gone.
    pub(crate) async fn settle(&self, r: &Reservation) -> Result<bool> {
        let Some(c) = self.holder(r) else {
            return Ok(false);
        };
        Ok(ack_one(&c, r.receipt.tag()).await)
    }
}
