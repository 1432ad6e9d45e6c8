//! Confirmed publishing: a message's properties and route (its queue, the delay chain,
//! or its dead-letter queue), publishes pipelined on the link's confirm-mode channel,
//! each batch published again on the next connection when the link drops on its way,
//! and the count of messages sent into the delay chain.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use lapin::options::BasicPublishOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation};
use queue_core::{Envelope, Error, Result};
use uuid::Uuid;

use crate::codec::{short_string, with_trace_context};
use crate::error::{broker, lock, TRANSPORT};
use crate::link::{Connector, Link};
use crate::topology::{dead_queue, delay_key, level_name, physical_queue, units, LEVELS, UNIT};

/// How long past its due time a delayed message still counts as delayed when this
/// process has not seen it come out (another process took it).
const DELAY_GRACE: Duration = Duration::from_secs(30);

/// A message as published: exchange, routing key, body, properties.
pub(crate) type Outgoing = (String, String, Vec<u8>, BasicProperties);

/// Where a message is published.
pub(crate) enum Target {
    /// Its queue, through the delay chain when it is not yet due.
    Queue,
    /// Its dead-letter queue.
    Dead,
}

/// Publishes envelopes, and counts those it sent into the delay chain.
#[derive(Default)]
pub(crate) struct Publisher {
    /// Messages this transport sent into the delay chain and has not seen come out, per
    /// queue, with when to stop counting them: the `delayed` of its stats. The chain is
    /// shared by every queue, so the broker cannot count them per queue.
    delayed: Mutex<HashMap<String, HashMap<Uuid, Instant>>>,
}

impl Publisher {
    /// Publishes `envelopes` and waits for every confirm.
    pub(crate) async fn send(
        &self,
        connector: &Connector,
        messages: Vec<(Envelope, Option<FieldTable>, Target)>,
    ) -> Result<()> {
        let now = Utc::now();
        let mut outgoing = Vec::with_capacity(messages.len());
        for (env, headers, target) in messages {
            // The body is the v1 envelope as UTF-8 JSON, for consumers other than this
            // transport (a shovel, a service in another language); uncompressed, so no
            // content_encoding.
            let mut props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_message_id(env.id.to_string().as_str().into())
                .with_type(short_string(&env.kind))
                .with_priority(match env.ordering_key {
                    // A priority would let a key's later message overtake an earlier one
                    // (RabbitMQ 4's quorum queues honour priorities too).
                    Some(_) => 0,
                    None => u8::try_from(env.priority.clamp(0, 9)).unwrap_or(0),
                });
            if let Some(trace) = &env.trace_id {
                props = props.with_correlation_id(short_string(trace));
            }
            if let Some(h) = with_trace_context(headers, &env) {
                props = props.with_headers(h);
            }
            let (exchange, key) = match target {
                Target::Queue => {
                    if let Some(exp) = env.expires_at {
                        let ms = (exp - now).num_milliseconds().max(0);
                        props = props.with_expiration(ms.to_string().as_str().into());
                    }
                    // A keyed message goes to its key's partition, through the chain too.
                    let route = physical_queue(&env).into_owned();
                    let delay = (env.available_at - now).to_std().unwrap_or(Duration::ZERO);
                    if delay >= UNIT / 2 {
                        lock(&self.delayed)
                            .entry(env.queue.as_str().to_owned())
                            .or_default()
                            .insert(env.id, Instant::now() + delay + DELAY_GRACE);
                        (level_name(LEVELS - 1), delay_key(units(delay), &route))
                    } else {
                        (String::new(), route)
                    }
                }
                Target::Dead => (String::new(), dead_queue(env.queue.as_str())),
            };
            outgoing.push((exchange, key, env.to_json().into_bytes(), props));
        }
        publish_all(connector, outgoing).await
    }

    /// Stops counting `id` as delayed on `queue`: it came out of the chain.
    pub(crate) fn came_out(&self, queue: &str, id: Uuid) {
        if let Some(ids) = lock(&self.delayed).get_mut(queue) {
            ids.remove(&id);
        }
    }

    /// The messages this transport delayed on `queue` that have not come out yet (and
    /// are not overdue by more than [`DELAY_GRACE`], when another process took them).
    pub(crate) fn delayed_count(&self, queue: &str) -> u64 {
        let mut delayed = lock(&self.delayed);
        let Some(ids) = delayed.get_mut(queue) else {
            return 0;
        };
        let now = Instant::now();
        ids.retain(|_, until| *until > now);
        ids.len() as u64
    }
}

/// Publishes `(exchange, routing key, body, properties)` messages, pipelined, and
/// waits for every confirm. When the connection drops on the way, it publishes them
/// all again on the next one: some may then be delivered twice, none is lost.
pub(crate) async fn publish_all(connector: &Connector, messages: Vec<Outgoing>) -> Result<()> {
    let options = connector.options();
    let deadline = Instant::now() + options.reconnect_timeout;
    loop {
        let link = connector.link().await?;
        match publish_on(&link, options.confirm_timeout, &messages).await {
            Err(err) if err.is_transient() && !link.usable() && Instant::now() < deadline => {
                tracing::warn!(error = %err, "a publish was cut off by a dropped connection; publishing it again");
            }
            done => return done,
        }
    }
}

async fn publish_on(link: &Link, timeout: Duration, messages: &[Outgoing]) -> Result<()> {
    let mut confirms = Vec::with_capacity(messages.len());
    for (exchange, key, body, props) in messages {
        let confirm = link
            .publisher
            .basic_publish(
                exchange.as_str().into(),
                key.as_str().into(),
                // Mandatory: a message no queue takes comes back instead of being
                // dropped (and confirmed).
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props.clone(),
            )
            .await
            .map_err(broker)?;
        confirms.push(confirm);
    }
    for confirm in confirms {
        match tokio::time::timeout(timeout, confirm).await {
            Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => {}
            Ok(Ok(Confirmation::Ack(Some(returned)))) => {
                return Err(Error::backend(
                    TRANSPORT,
                    false,
                    format!(
                        "the broker routed a publish to no queue (returned: {}); was its queue deleted?",
                        returned.reply_text
                    ),
                ))
            }
            Ok(Ok(Confirmation::Nack(_))) => {
                return Err(Error::backend(
                    TRANSPORT,
                    true,
                    "the broker refused a publish (nack): it may be short of memory or disk",
                ))
            }
            Ok(Err(err)) => return Err(broker(err)),
            Err(_) => {
                return Err(Error::backend(
                    TRANSPORT,
                    true,
                    format!("no confirm from the broker within {timeout:?}"),
                ))
            }
        }
    }
    Ok(())
}
