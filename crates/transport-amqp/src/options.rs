use std::time::Duration;

use queue_core::{Config, SecretUrl, DEFAULT_MAX_PAYLOAD_BYTES};

/// The kind of the queues the transport declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueKind {
    /// Replicated quorum queues (RabbitMQ 3.8+): the broker counts deliveries
    /// (`x-delivery-count`) and dead-letters a message past `x-delivery-limit`. No
    /// priorities before RabbitMQ 4.0.
    #[default]
    Quorum,
    /// Classic queues, with priorities 0-9 (`x-max-priority`).
    Classic,
}

/// How to reach RabbitMQ and how to use it.
#[derive(Debug, Clone)]
pub struct AmqpOptions {
    /// `amqp://user:password@host:port/vhost` (`AMQP_URL`).
    pub url: SecretUrl,
    /// Quorum (default) or classic queues.
    pub queue_kind: QueueKind,
    /// Deliveries a consumer holds unacknowledged per queue (`basic.qos`).
    pub prefetch: u16,
    /// How long a publish waits for the broker's confirm before it fails.
    pub confirm_timeout: Duration,
    /// Deliveries of one message after which a quorum queue dead-letters it itself, a
    /// safety net below the worker's own attempt limit.
    pub delivery_limit: u32,
    /// The largest encoded envelope accepted.
    pub max_payload_bytes: usize,
}

impl AmqpOptions {
    /// Options for `url` with the contract's defaults.
    pub fn new(url: impl Into<String>) -> Self {
        AmqpOptions {
            url: SecretUrl::new(url),
            queue_kind: QueueKind::default(),
            prefetch: 256,
            confirm_timeout: Duration::from_secs(30),
            delivery_limit: 100,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }

    /// Options from the environment configuration (`AMQP_URL`).
    pub fn from_config(config: &Config) -> Self {
        AmqpOptions::new(config.amqp_url.expose())
    }

    /// Sets the queue kind.
    pub fn with_queue_kind(mut self, kind: QueueKind) -> Self {
        self.queue_kind = kind;
        self
    }

    /// Sets the prefetch.
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }
}
