//! The connection to the broker: one [`Link`] (a connection with its publishing channel
//! in confirm mode, and the queues declared on it), and the [`Connector`] that holds the
//! current one and replaces it, with backoff and failover across the nodes, when it
//! drops.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use queue_core::sql::Wakers;
use queue_core::{Error, Result};

use crate::connect::{self, Node};
use crate::error::{broker, closed_error, lock, source_text, TRANSPORT};
use crate::options::AmqpOptions;
use crate::topology::declare_delay_chain;

/// How long a channel or connection close waits for the broker's answer.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long setting up a new connection may take once it is open (channel, confirm
/// mode, the delay chain's declarations).
const SETUP_TIMEOUT: Duration = Duration::from_secs(25);
/// The longest pause between reconnect attempts.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// One connection with its publishing channel (in confirm mode), and the queues declared
/// on it.
pub(crate) struct Link {
    /// Which of the transport's nodes this connection is to.
    node: usize,
    pub(crate) conn: Connection,
    pub(crate) publisher: Channel,
    pub(crate) declared: Mutex<HashSet<String>>,
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
        // The broker's list of connections and consumers names the holder of each
        // delivery this way: RabbitMQ keeps no holder per message.
        let name = options
            .connection_name
            .clone()
            .unwrap_or_else(|| format!("switchyard {}", queue_core::status::worker_label()));
        let props = ConnectionProperties::default().with_connection_name(name.into());
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

    pub(crate) fn usable(&self) -> bool {
        self.conn.status().connected() && self.publisher.status().connected()
    }
}

/// The transport's options, the broker's nodes and the current [`Link`], replaced when
/// it drops: every other part of the transport reaches the broker through it.
pub(crate) struct Connector {
    options: AmqpOptions,
    /// The broker's addresses: one, or the nodes of a cluster.
    nodes: Vec<Node>,
    link: Mutex<Arc<Link>>,
    /// One reconnect at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// When and why the last reconnect gave up.
    last_failure: Mutex<Option<(Instant, String)>>,
    /// Set by [`Connector::close`]: no reconnecting after it.
    shut: AtomicBool,
    wakers: Arc<Wakers>,
}

impl Connector {
    /// Connects to the first node that answers; `AmqpTransport::connect` says how it
    /// waits for a broker that cannot be reached.
    pub(crate) async fn connect(options: AmqpOptions) -> Result<Connector> {
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
        Ok(Connector {
            options,
            nodes,
            link: Mutex::new(Arc::new(link)),
            reconnecting: tokio::sync::Mutex::default(),
            last_failure: Mutex::default(),
            shut: AtomicBool::new(false),
            wakers: Arc::default(),
        })
    }

    pub(crate) fn options(&self) -> &AmqpOptions {
        &self.options
    }

    /// The wake-ups of each queue's idle workers: here, since a reconnect wakes them all.
    pub(crate) fn wakers(&self) -> &Arc<Wakers> {
        &self.wakers
    }

    /// Closes the connection; deliveries held unacknowledged go back to their queues.
    pub(crate) async fn close(&self) {
        self.shut.store(true, Ordering::SeqCst);
        let link = self.current();
        let _ = link.conn.close(200, "closed".into()).await;
    }

    /// The node of the current connection, as `host:port`.
    pub(crate) fn connected_node(&self) -> String {
        let endpoint = &self.nodes[self.current().node].endpoint;
        format!("{}:{}", endpoint.host, endpoint.port)
    }

    pub(crate) fn current(&self) -> Arc<Link> {
        lock(&self.link).clone()
    }

    /// The live connection, reconnecting with backoff when it dropped.
    pub(crate) async fn link(&self) -> Result<Arc<Link>> {
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

    /// A channel of its own on the current connection (a refused declaration or get
    /// closes only it).
    pub(crate) async fn channel(&self) -> Result<Channel> {
        self.link()
            .await?
            .conn
            .create_channel()
            .await
            .map_err(broker)
    }
}
