//! The bare baseline on RabbitMQ: bare lapin, persistent messages to a durable quorum
//! queue of its own through the default exchange, and one consumer with a prefetch of
//! 100 acking each message.

use std::time::Instant;

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use switchyard::{Error, Result};

use super::Rest;

fn err(e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("bench baseline (bare lapin): {e}"))
}

/// The baseline's connection, confirming channel and queue.
pub(super) struct Bare {
    conn: Connection,
    ch: Channel,
    queue: String,
    /// Messages published one at a time, which the drain also takes.
    singles: usize,
}

async fn publish(ch: &Channel, queue: &str, body: &str) -> Result<PublisherConfirm> {
    ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body.as_bytes(),
        BasicProperties::default().with_delivery_mode(2),
    )
    .await
    .map_err(err)
}

impl Bare {
    pub(super) async fn open(url: &str) -> Result<Self> {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(err)?;
        let ch = conn.create_channel().await.map_err(err)?;
        let bare = Bare {
            conn,
            ch,
            queue: format!("bench.bare.{}", uuid::Uuid::new_v4().simple()),
            singles: 0,
        };
        if let Err(e) = bare.declare().await {
            let _ = bare.close().await;
            return Err(e);
        }
        Ok(bare)
    }

    async fn declare(&self) -> Result<()> {
        self.ch
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(err)?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.ch
            .queue_declare(self.queue.as_str().into(), durable, args)
            .await
            .map_err(err)?;
        Ok(())
    }

    /// Publishes one batch with its confirms pipelined.
    pub(super) async fn insert_batch(&self, payloads: &[String]) -> Result<()> {
        let mut confirms = Vec::with_capacity(payloads.len());
        for body in payloads {
            confirms.push(publish(&self.ch, &self.queue, body).await?);
        }
        for confirm in confirms {
            confirm.await.map_err(err)?;
        }
        Ok(())
    }

    /// Removes every message from the queue (the warm-up's, before anything is timed).
    pub(super) async fn purge(&self) -> Result<()> {
        self.ch
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .map_err(err)?;
        Ok(())
    }

    /// Publishes `singles` one at a time, each waiting for its confirm.
    pub(super) async fn insert_singles(&mut self, singles: &[String]) -> Result<()> {
        for body in singles {
            publish(&self.ch, &self.queue, body)
                .await?
                .await
                .map_err(err)?;
        }
        self.singles += singles.len();
        Ok(())
    }

    /// Drains the single publishes and the `rows` published in batches, and measures the
    /// pickup floor.
    pub(super) async fn measure(&self, rows: usize) -> Result<Rest> {
        let (conn, queue) = (&self.conn, self.queue.as_str());
        let total = self.singles + rows;
        let started = Instant::now();
        let (consumer_ch, mut consumer) = super::super::floor::bare_consumer(conn, queue).await?;
        let mut drained = 0;
        while drained < total {
            let Some(delivery) = consumer.next().await else {
                return Err(err("the consumer ended early"));
            };
            delivery
                .map_err(err)?
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(err)?;
            drained += 1;
        }
        let drain_per_s = super::super::workload::rate(total, started.elapsed());
        super::super::floor::cancel(&consumer_ch, consumer).await?;
        let pickup = super::super::floor::amqp(conn, queue).await?;
        Ok(Rest {
            drain_per_s,
            pickup: Some(pickup),
        })
    }

    /// Deletes the queue and closes the connection.
    pub(super) async fn close(self) -> Result<()> {
        let deleted = self
            .ch
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self.conn.close(200, "done".into()).await;
        deleted.map(|_| ()).map_err(err)
    }
}
