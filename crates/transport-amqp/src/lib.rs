//! RabbitMQ (AMQP 0-9-1) transport for switchyard, on lapin.
//!
//! Selected by the `switchyard` facade's `amqp` feature and `QUEUE_BACKEND=rabbitmq`:
//! durable quorum or classic queues, publishes confirmed by the broker, delays through a
//! fixed chain of TTL queues, reserves from a consumer with a bounded prefetch, acks
//! fenced by the consumer channel's generation, release, dead letters in `<queue>.dead`
//! with list, replay and purge, and reconnecting with backoff. The rest of this page
//! (the crate's README) says how, and where AMQP cannot keep the contract.
//!
#![doc = include_str!("../README.md")]

mod claim;
mod codec;
mod connect;
mod consumer;
mod consumers;
mod dead;
mod error;
mod gate;
mod link;
mod marks;
mod options;
mod publish;
mod queues;
mod topology;
mod transport;
mod unique;

pub use options::{AmqpOptions, QueueKind};
pub use transport::AmqpTransport;
