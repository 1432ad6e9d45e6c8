use std::sync::Arc;
use std::time::Duration;

use queue_core::status::StatusStore;
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
    /// Deliveries a consumer holds unacknowledged per queue (`basic.qos`). The default,
    /// 1,024, is above what a worker holds by default (256 claimed ahead and up to 256
    /// handled awaiting their coalesced ack), so its reserves are served from what the
    /// broker pushed rather than one `basic.get` round trip at a time. The cost: should
    /// the process die, every delivery it held returns to the queue, and a quorum queue
    /// counts each return as an attempt.
    pub prefetch: u16,
    /// How long a publish waits for the broker's confirm before it fails.
    pub confirm_timeout: Duration,
    /// Deliveries of one message after which a quorum queue dead-letters it itself, a
    /// safety net below the worker's own attempt limit.
    pub delivery_limit: u32,
    /// The largest encoded envelope accepted.
    pub max_payload_bytes: usize,
    /// How long an operation waits for the broker to come back after the connection
    /// dropped (reconnecting with backoff) before it fails with a transient error; the
    /// first connect waits as long, unless [`retry_first_connect`](Self::retry_first_connect)
    /// is off.
    pub reconnect_timeout: Duration,
    /// Whether [`AmqpTransport::connect`](crate::AmqpTransport::connect) tries again
    /// while the broker is unreachable, for up to `reconnect_timeout` (the default), or
    /// fails at once: for read-only tools, whose user would rather hear now that the
    /// broker is down.
    pub retry_first_connect: bool,
    /// How long one attempt to open a connection (TCP, TLS, AMQP handshake) may take
    /// (`QUEUE_CONNECT_TIMEOUT`).
    pub connect_timeout: Duration,
    /// The connection name the broker shows (`rabbitmqctl list_connections
    /// user_provided_name`); by default `switchyard host:pid`.
    pub connection_name: Option<String>,
    /// Queues (and their dead-letter queues) the broker deletes after they were unused
    /// this long (`x-expires`): for temporary queues, such as tests'. `None` (the
    /// default) keeps them.
    pub queue_expires: Option<Duration>,
    /// The SQL control store beside the broker (the job status store of
    /// `DATABASE_URL`), where each start is marked before its handler runs. With it, a
    /// delivery that comes back from a dead consumer is charged an attempt only when
    /// its mark says it was started; without it, the broker's count charges every
    /// delivery the consumer held, started or merely prefetched. A worker over the
    /// transport must record job status in this same store (`Worker::with_status`), or
    /// it refuses to start.
    pub control_store: Option<Arc<dyn StatusStore>>,
}

impl AmqpOptions {
    /// Options for `url` with the contract's defaults.
    pub fn new(url: impl Into<String>) -> Self {
        AmqpOptions {
            url: SecretUrl::new(url),
            queue_kind: QueueKind::default(),
            prefetch: 1024,
            confirm_timeout: Duration::from_secs(30),
            delivery_limit: 100,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            reconnect_timeout: Duration::from_secs(30),
            retry_first_connect: true,
            connect_timeout: Config::DEFAULT_CONNECT_TIMEOUT,
            connection_name: None,
            queue_expires: None,
            control_store: None,
        }
    }

    /// Options from the environment configuration (`AMQP_URL`, `AMQP_QUEUE_TYPE`).
    pub fn from_config(config: &Config) -> Self {
        let kind = if config.amqp_classic_queues {
            QueueKind::Classic
        } else {
            QueueKind::Quorum
        };
        AmqpOptions {
            connect_timeout: config.connect_timeout,
            ..AmqpOptions::new(config.amqp_url.expose()).with_queue_kind(kind)
        }
    }

    /// Sets how long one connection attempt may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
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

    /// Sets how long an operation waits for a dropped connection to come back.
    pub fn with_reconnect_timeout(mut self, timeout: Duration) -> Self {
        self.reconnect_timeout = timeout;
        self
    }

    /// Sets whether the first connect waits for an unreachable broker (see
    /// [`AmqpOptions::retry_first_connect`]).
    pub fn with_retry_first_connect(mut self, retry: bool) -> Self {
        self.retry_first_connect = retry;
        self
    }

    /// Sets the connection name the broker shows.
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// Marks starts in `store` (see [`AmqpOptions::control_store`]); the transport's
    /// [`control_store`](crate::AmqpTransport::control_store) is then this store, and a
    /// worker over it must record job status there.
    pub fn with_control_store(mut self, store: Arc<dyn StatusStore>) -> Self {
        self.control_store = Some(store);
        self
    }

    /// Lets the broker delete queues unused for `after` (`x-expires`).
    pub fn with_queue_expires(mut self, after: Duration) -> Self {
        self.queue_expires = Some(after);
        self
    }
}
