//! The queues the transport declares: each logical queue with its dead-letter queue,
//! declared once per connection, and every queue this transport used (AMQP cannot list
//! a broker's queues, so these are what "all queues" means).

use std::collections::HashSet;
use std::sync::Mutex;

use lapin::options::{QueueBindOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use queue_core::{Error, QueueName, Result};

use crate::codec::long_string;
use crate::error::{broker, declare_error, lock};
use crate::link::Connector;
use crate::options::QueueKind;
use crate::topology::{
    dead_queue, delivery_binding, durable, partition_name, passive, DELIVERY_EXCHANGE,
    MAX_QUEUE_NAME, PARTITIONS,
};

/// The logical queues this transport declared.
#[derive(Default)]
pub(crate) struct Queues {
    /// Every queue this transport used, for stats and dead-letter commands over all.
    known: Mutex<HashSet<String>>,
    /// One declaration at a time. A second declaration of a quorum queue that another is
    /// creating is answered at once, before the queue has elected its leader, and a
    /// consume then crashes the broker's channel and the whole connection
    /// (`{badmatch,{error,noproc}}` in RabbitMQ 3.10): waiting for the first one's
    /// answer, which comes once the queue is up, avoids it.
    declaring: tokio::sync::Mutex<()>,
}

impl Queues {
    /// Declares `queue` and its dead-letter queue once per connection.
    pub(crate) async fn ensure(&self, connector: &Connector, queue: &str) -> Result<()> {
        if queue.len() > MAX_QUEUE_NAME {
            return Err(Error::InvalidInput(format!(
                "queue name {queue:?} is {} bytes; on RabbitMQ at most {MAX_QUEUE_NAME} are accepted (delay routing keys and the `.dead` queue need the rest)",
                queue.len()
            )));
        }
        self.declare(connector, queue, queue, false).await
    }

    /// Declares `queue` and its [`PARTITIONS`] partition queues for keyed messages,
    /// each with a single active consumer, dead-lettering to `queue`'s dead-letter queue.
    pub(crate) async fn ensure_partitions(&self, connector: &Connector, queue: &str) -> Result<()> {
        self.ensure(connector, queue).await?;
        for n in 0..PARTITIONS {
            self.declare(connector, &partition_name(queue, n), queue, true)
                .await?;
        }
        Ok(())
    }

    /// Declares the broker queue `name` of the logical queue `queue` (itself, or one of
    /// its partitions, `single`: with a single active consumer) once per connection,
    /// and `queue`'s dead-letter queue with the logical one.
    async fn declare(
        &self,
        connector: &Connector,
        name: &str,
        queue: &str,
        single: bool,
    ) -> Result<()> {
        let link = connector.link().await?;
        let options = connector.options();
        if lock(&link.declared).contains(name) {
            return Ok(());
        }
        let _one = self.declaring.lock().await;
        if lock(&link.declared).contains(name) {
            return Ok(());
        }
        // A channel of its own: a refused declaration closes the channel it ran on.
        let ch = link.conn.create_channel().await.map_err(broker)?;
        let dead = dead_queue(queue);
        let mut dead_args = FieldTable::default();
        let mut args = FieldTable::default();
        if let Some(after) = options.queue_expires {
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
        let declare_dead = !single
            && match options.queue_kind {
                QueueKind::Quorum => {
                    dead_args.insert("x-queue-type".into(), long_string("quorum"));
                    !queue_exists(connector, &dead).await?
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
        if single {
            // One consumer at a time takes the partition, in order; the others wait.
            args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        }
        match options.queue_kind {
            QueueKind::Quorum => {
                args.insert("x-queue-type".into(), long_string("quorum"));
                args.insert(
                    "x-delivery-limit".into(),
                    AMQPValue::LongInt(i32::try_from(options.delivery_limit).unwrap_or(i32::MAX)),
                );
            }
            // A partition keeps its keys' order, which priorities would break.
            QueueKind::Classic if !single => {
                args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(9));
            }
            QueueKind::Classic => {}
        }
        ch.queue_declare(name.into(), durable(), args)
            .await
            .map_err(|e| declare_error(name, e))?;
        ch.queue_bind(
            name.into(),
            DELIVERY_EXCHANGE.into(),
            delivery_binding(name).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
        let _ = ch.close(200, "declared".into()).await;
        lock(&link.declared).insert(name.to_owned());
        if !single {
            lock(&self.known).insert(queue.to_owned());
        }
        Ok(())
    }

    /// Deletes `queue` and its dead-letter queue, messages and all.
    pub(crate) async fn delete(&self, connector: &Connector, queue: &QueueName) -> Result<()> {
        let link = connector.link().await?;
        let ch = link.conn.create_channel().await.map_err(broker)?;
        let partitions = (0..PARTITIONS).map(|n| partition_name(queue.as_str(), n));
        let names: Vec<String> = [queue.as_str().to_owned(), dead_queue(queue.as_str())]
            .into_iter()
            .chain(partitions)
            .collect();
        // Deleting a queue that does not exist (partitions never used) succeeds.
        for name in &names {
            ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(broker)?;
            lock(&link.declared).remove(name.as_str());
        }
        let _ = ch.close(200, "done".into()).await;
        lock(&self.known).remove(queue.as_str());
        Ok(())
    }

    /// The queues this transport declared (the dead-letter queues not listed).
    pub(crate) fn names(&self) -> Vec<String> {
        lock(&self.known).iter().cloned().collect()
    }

    /// The queues a command over `queue` (or all queues) acts on. AMQP cannot list a
    /// broker's queues, so "all" means those this transport used, and is an error in a
    /// process that used none (a command-line tool, say).
    pub(crate) fn selected(&self, queue: Option<&QueueName>) -> Result<Vec<String>> {
        match queue {
            Some(q) => Ok(vec![q.as_str().to_owned()]),
            None => {
                let known = self.names();
                if known.is_empty() {
                    return Err(Error::NotSupported(
                        "RabbitMQ cannot list its queues over AMQP: name the queue (--queue Q); `rabbitmqctl list_queues` shows them".into(),
                    ));
                }
                Ok(known)
            }
        }
    }
}

/// Whether the broker has a queue of this name (a passive declaration, on a channel
/// of its own since a refused one closes its channel).
pub(crate) async fn queue_exists(connector: &Connector, name: &str) -> Result<bool> {
    let ch = connector.channel().await?;
    match ch
        .queue_declare(name.into(), passive(), FieldTable::default())
        .await
    {
        Ok(_) => {
            let _ = ch.close(200, "checked".into()).await;
            Ok(true)
        }
        // NOT_FOUND closes the channel.
        Err(err) if crate::error::not_found(&err) => Ok(false),
        Err(err) => Err(broker(err)),
    }
}
