//! RabbitMQ (AMQP 0-9-1) transport for switchyard, on lapin.
//!
//! Work in progress (issue 6): not yet selected by the `switchyard` facade. What is
//! here: durable quorum or classic queues, publishes confirmed by the broker, delays
//! through a fixed chain of TTL queues, reserves from a consumer with a bounded
//! prefetch, acks fenced by the consumer channel's generation, release, dead letters
//! in `<queue>.dead` with list, replay and purge. Still missing: reconnecting after a
//! broker restart, the conformance suite's list of what does not apply to AMQP,
//! the facade and CLI, and the benchmark.

mod options;
mod topology;
mod transport;

pub use options::{AmqpOptions, QueueKind};
pub use transport::AmqpTransport;
