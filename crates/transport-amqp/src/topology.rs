//! Names and routing of the broker objects the transport declares, and the declaration of
//! the delay chain that each new connection makes (below the link, which needs it).
//!
//! Delays use a fixed set of [`LEVELS`] TTL queues chained through dead-letter
//! exchanges (the binary scheme of NServiceBus and Kombu), never one queue per delay
//! value: level `k` holds messages for 2^k × [`UNIT`]. A delayed message is published
//! to the highest level's exchange with a routing key of one word per level (`1` = wait
//! at that level, `0` = pass it) followed by its queue's name; each level's topic
//! exchange either routes it to that level's queue (whose TTL then dead-letters it to the
//! next level's exchange) or passes it straight on. The last level hands it to the
//! delivery exchange, where each queue is bound by the exact key `*.….*.<queue>`. Every
//! message in one level queue has the same TTL, so messages expire at the head in
//! order, which per-message TTL would not. Precision: delays are rounded up to
//! [`UNIT`]; the longest is (2^[`LEVELS`] − 1) × [`UNIT`], about 38.8 days, and a
//! longer one goes round the chain again when it arrives early.

use std::time::Duration;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use queue_core::Result;

use crate::codec::long_string;
use crate::error::broker;

/// Delay levels.
pub(crate) const LEVELS: u32 = 25;
/// The shortest delay step.
pub(crate) const UNIT: Duration = Duration::from_millis(100);
/// Exchange prefix of the delay levels, and the delivery exchange.
pub(crate) const DELAY_EXCHANGE: &str = "switchyard.delay";
pub(crate) const DELIVERY_EXCHANGE: &str = "switchyard.delivery";
/// The longest queue name: AMQP routing keys and names are at most 255 bytes, and a
/// delayed message's key carries two characters per level before the name.
pub(crate) const MAX_QUEUE_NAME: usize = 255 - 2 * LEVELS as usize - ".dead".len();

/// The exchange and queue of level `k`.
pub(crate) fn level_name(k: u32) -> String {
    format!("{DELAY_EXCHANGE}.{k}")
}

/// The partition queues of each logical queue that keyed messages go to.
pub(crate) const PARTITIONS: u64 = 8;

/// Partition `n` of `queue`. `~` is outside queue names' characters, so no logical
/// queue can be named like a partition, and is literal in topic routing keys.
pub(crate) fn partition_name(queue: &str, n: u64) -> String {
    format!("{queue}~k{n}")
}

/// The broker queue that holds `env`: its queue, or for a message with an ordering
/// key the partition its key hashes to (the same in every process: FNV-1a).
pub(crate) fn physical_queue(env: &queue_core::Envelope) -> std::borrow::Cow<'_, str> {
    match &env.ordering_key {
        None => std::borrow::Cow::Borrowed(env.queue.as_str()),
        Some(key) => std::borrow::Cow::Owned(partition_name(
            env.queue.as_str(),
            queue_core::stable_hash::fnv1a(key.as_bytes()) % PARTITIONS,
        )),
    }
}

/// The dead-letter queue of `queue`.
pub(crate) fn dead_queue(queue: &str) -> String {
    format!("{queue}.dead")
}

/// Delay units for `delay`, rounded up, capped at the chain's length.
pub(crate) fn units(delay: Duration) -> u32 {
    let unit = UNIT.as_millis().max(1);
    let n = delay.as_millis().div_ceil(unit);
    u32::try_from(n).unwrap_or(u32::MAX).min((1 << LEVELS) - 1)
}

/// The routing key of a message delayed by `units` for `queue`.
pub(crate) fn delay_key(units: u32, queue: &str) -> String {
    let mut key = String::with_capacity(2 * LEVELS as usize + queue.len());
    for k in (0..LEVELS).rev() {
        key.push(if units & (1 << k) != 0 { '1' } else { '0' });
        key.push('.');
    }
    key.push_str(queue);
    key
}

/// The binding of level `k`'s queue (`wait`) or of its pass-through to the next level.
pub(crate) fn level_binding(k: u32, wait: bool) -> String {
    let mut key = String::new();
    for level in (0..LEVELS).rev() {
        key.push(match (level == k, wait) {
            (true, true) => '1',
            (true, false) => '0',
            (false, _) => '*',
        });
        key.push('.');
    }
    key.push('#');
    key
}

/// The binding of `queue` to the delivery exchange.
pub(crate) fn delivery_binding(queue: &str) -> String {
    let mut key = "*.".repeat(LEVELS as usize);
    key.push_str(queue);
    key
}

/// A declaration that only asks whether the queue exists (NOT_FOUND closes its channel).
pub(crate) fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    }
}

pub(crate) fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

pub(crate) async fn declare_delay_chain(ch: &Channel) -> Result<()> {
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    ch.exchange_declare(
        DELIVERY_EXCHANGE.into(),
        ExchangeKind::Topic,
        durable_exchange,
        FieldTable::default(),
    )
    .await
    .map_err(broker)?;
    for k in 0..LEVELS {
        ch.exchange_declare(
            level_name(k).as_str().into(),
            ExchangeKind::Topic,
            durable_exchange,
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
    }
    for k in 0..LEVELS {
        let next = if k == 0 {
            DELIVERY_EXCHANGE.to_owned()
        } else {
            level_name(k - 1)
        };
        let mut args = FieldTable::default();
        let ttl = UNIT.as_millis() * (1u128 << k);
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(i64::try_from(ttl).unwrap_or(i64::MAX)),
        );
        args.insert("x-dead-letter-exchange".into(), long_string(&next));
        args.insert("x-queue-type".into(), long_string("quorum"));
        // Never lose a message between levels: the broker confirms the hop.
        args.insert(
            "x-dead-letter-strategy".into(),
            long_string("at-least-once"),
        );
        args.insert("x-overflow".into(), long_string("reject-publish"));
        let name = level_name(k);
        ch.queue_declare(name.as_str().into(), durable(), args)
            .await
            .map_err(broker)?;
        ch.queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            level_binding(k, true).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
        ch.exchange_bind(
            next.as_str().into(),
            name.as_str().into(),
            level_binding(k, false).as_str().into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(broker)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_the_unit_and_cap_at_the_chain() {
        assert_eq!(units(Duration::ZERO), 0);
        assert_eq!(units(Duration::from_millis(1)), 1);
        assert_eq!(units(Duration::from_millis(250)), 3);
        assert_eq!(
            units(Duration::from_secs(3600 * 24 * 365)),
            (1 << LEVELS) - 1
        );
    }

    #[test]
    fn a_key_names_each_level_then_the_queue() {
        let key = delay_key(5, "a.b");
        let words: Vec<&str> = key.split('.').collect();
        assert_eq!(words.len(), LEVELS as usize + 2);
        assert_eq!(&words[LEVELS as usize - 3..], &["1", "0", "1", "a", "b"]);
        assert!(key.len() <= 255 - ".dead".len() || "a.b".len() > MAX_QUEUE_NAME);
        assert_eq!(
            delivery_binding("a.b").split('.').count(),
            LEVELS as usize + 2
        );
        assert!(level_binding(0, true).ends_with("1.#"));
        assert!(level_binding(LEVELS - 1, false).starts_with("0."));
    }
}
