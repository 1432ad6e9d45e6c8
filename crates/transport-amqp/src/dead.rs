//! Dead letters: how the transport reads a dead-letter queue (every message taken on a
//! channel of its own, the picked ones acked, the rest given back by closing it), and
//! its [`DeadLetters`] methods, list, replay, purge and insert, on top of that read.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use queue_core::{text, DeadLetter, DeadLetters, DeadSelection, Error, QueueName, Result};

use crate::codec::{dead_letter_of, long_string, H_DEAD_AT, H_ERROR, H_REASON};
use crate::error::broker;
use crate::options::QueueKind;
use crate::publish::{publish_all, Target};
use crate::queues::queue_exists;
use crate::topology::{dead_queue, passive};
use crate::transport::AmqpTransport;

/// What a read of a dead-letter queue holds: its channel (with every message read
/// unacknowledged), the letters picked, and how many were read in all.
struct DeadRead {
    channel: Channel,
    picked: Vec<(u64, DeadLetter)>,
    read: u32,
}

impl AmqpTransport {
    /// Reads every message of `queue`'s dead-letter queue on a channel of its own and
    /// returns the channel with the letters `pick` chose (unacknowledged). Closing the
    /// channel gives back what was not acked, in its order. `None` when the broker has
    /// no such queue: reading declares nothing.
    async fn read_dead<F>(&self, queue: &str, mut pick: F) -> Result<Option<DeadRead>>
    where
        F: FnMut(&DeadLetter) -> bool,
    {
        if !queue_exists(&self.connector, &dead_queue(queue)).await? {
            return Ok(None);
        }
        self.queues.ensure(&self.connector, queue).await?;
        let ch = self.connector.channel().await?;
        let dead = dead_queue(queue);
        let mut picked = Vec::new();
        let mut read = 0_u32;
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions::default())
            .await
            .map_err(broker)?
        {
            read = read.saturating_add(1);
            let letter = dead_letter_of(&m, queue);
            if pick(&letter) {
                picked.push((m.delivery.delivery_tag, letter));
            }
        }
        Ok(Some(DeadRead {
            channel: ch,
            picked,
            read,
        }))
    }

    /// Closes a dead-letter reading channel, which gives back what it did not ack, and
    /// waits (up to 2 s) until the queue counts those again: a quorum queue takes
    /// returns back after the close, and a `stats` or a listing right after would miss
    /// them.
    async fn put_back_unread(&self, channel: Channel, queue: &str, returned: u32) {
        let _ = channel.close(200, "done".into()).await;
        if returned == 0 || self.options().queue_kind == QueueKind::Classic {
            return;
        }
        let dead = dead_queue(queue);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let Ok(ch) = self.connector.channel().await else {
                return;
            };
            let counted = ch
                .queue_declare(dead.as_str().into(), passive(), FieldTable::default())
                .await
                .map(|q| q.message_count());
            let _ = ch.close(200, "counted".into()).await;
            match counted {
                Ok(n) if n < returned => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => return,
            }
        }
    }

    /// Replays (`replay`) or purges the selected dead letters; how many.
    async fn settle_dead(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
        replay: bool,
    ) -> Result<u64> {
        let now = Utc::now();
        let selected = |d: &DeadLetter| match selection {
            DeadSelection::Id(id) => &d.id == id,
            DeadSelection::OlderThan(age) => {
                d.dead_at <= now - chrono::Duration::from_std(*age).unwrap_or_default()
            }
            _ => true,
        };
        let mut n = 0;
        for q in self.queues.selected(queue)? {
            let Some(DeadRead {
                channel: ch,
                picked,
                read,
            }) = self.read_dead(&q, selected).await?
            else {
                continue;
            };
            let mut settled = 0_u32;
            for (tag, letter) in picked {
                if replay {
                    let Some(mut env) = letter.envelope else {
                        // A malformed letter cannot be delivered; it stays.
                        continue;
                    };
                    env.attempts = 0;
                    env.available_at = Utc::now();
                    env.expires_at = None;
                    // It goes to the queue it names, which may not be this one (a
                    // quarantined message of another queue) nor declared yet.
                    if env.ordering_key.is_some() {
                        self.queues
                            .ensure_partitions(&self.connector, env.queue.as_str())
                            .await?;
                    } else {
                        self.queues
                            .ensure(&self.connector, env.queue.as_str())
                            .await?;
                    }
                    self.publisher
                        .send(&self.connector, vec![(env, None, Target::Queue)])
                        .await?;
                }
                ch.basic_ack(tag, BasicAckOptions::default())
                    .await
                    .map_err(broker)?;
                n += 1;
                settled += 1;
            }
            self.put_back_unread(ch, &q, read.saturating_sub(settled))
                .await;
        }
        if n == 0 {
            if let DeadSelection::Id(id) = selection {
                return Err(Error::NotFound {
                    what: "dead letter",
                    id: id.clone(),
                });
            }
        }
        if replay && n > 0 {
            self.connector.wakers().wake_all();
        }
        Ok(n)
    }
}

#[async_trait]
impl DeadLetters for AmqpTransport {
    async fn dead_insert(&self, letters: &[DeadLetter]) -> Result<u64> {
        let mut outgoing = Vec::with_capacity(letters.len());
        for letter in letters {
            self.queues.ensure(&self.connector, &letter.queue).await?;
            let mut headers = FieldTable::default();
            headers.insert(
                H_REASON.into(),
                long_string(&text::reason_text(&letter.reason)),
            );
            headers.insert(
                H_DEAD_AT.into(),
                AMQPValue::LongLongInt(letter.dead_at.timestamp_millis()),
            );
            let body = match &letter.envelope {
                Some(env) => {
                    let mut env = env.clone();
                    env.attempts = letter.attempts;
                    env.last_error = letter.last_error.as_deref().map(text::error_text);
                    env.to_json()
                }
                None => {
                    if let Some(e) = &letter.last_error {
                        headers.insert(H_ERROR.into(), long_string(&text::error_text(e)));
                    }
                    letter.raw.clone().unwrap_or_default()
                }
            };
            let mut props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(letter.id.as_str().into())
                .with_headers(headers);
            // A malformed letter's raw text is kept as it was, of no known type.
            if letter.envelope.is_some() {
                props = props.with_content_type("application/json".into());
            }
            outgoing.push((
                String::new(),
                dead_queue(&letter.queue),
                body.into_bytes(),
                props,
            ));
        }
        publish_all(&self.connector, outgoing).await?;
        Ok(letters.len() as u64)
    }

    async fn dead_list(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut out = Vec::new();
        for q in self.queues.selected(queue)? {
            let Some(DeadRead {
                channel, picked, ..
            }) = self.read_dead(&q, |_| true).await?
            else {
                continue;
            };
            let returned = u32::try_from(picked.len()).unwrap_or(u32::MAX);
            self.put_back_unread(channel, &q, returned).await;
            out.extend(picked.into_iter().map(|(_, d)| d));
        }
        out.sort_by_key(|d| d.dead_at);
        out.truncate(limit);
        Ok(out)
    }

    async fn dead_replay(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, true).await
    }

    async fn dead_purge(
        &self,
        queue: Option<&QueueName>,
        selection: &DeadSelection,
    ) -> Result<u64> {
        self.settle_dead(queue, selection, false).await
    }
}
