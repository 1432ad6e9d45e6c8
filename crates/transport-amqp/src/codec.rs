//! How the transport's own data travels in AMQP headers and properties: dead-letter
//! headers (reason, time of death, error), the broker's delivery count and death
//! records, and a dead-letter queue message read back as a [`DeadLetter`].

use chrono::{DateTime, Utc};
use lapin::message::{BasicGetMessage, Delivery};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use queue_core::{DeadLetter, Envelope};

/// Headers of a dead letter.
pub(crate) const H_REASON: &str = "x-switchyard-reason";
pub(crate) const H_DEAD_AT: &str = "x-switchyard-dead-at";
/// Why a quarantined message was quarantined (its body is kept as it was).
pub(crate) const H_ERROR: &str = "x-switchyard-error";

pub(crate) fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

/// `headers` with the envelope's W3C trace context (`traceparent`, `tracestate`) added,
/// where other AMQP consumers and broker tracing look for it; the envelope keeps it too.
pub(crate) fn with_trace_context(
    headers: Option<FieldTable>,
    env: &Envelope,
) -> Option<FieldTable> {
    use queue_core::trace_context::{TRACEPARENT, TRACESTATE};
    let mut trace = [TRACEPARENT, TRACESTATE]
        .into_iter()
        .filter_map(|name| env.headers.get(name).map(|value| (name, value)))
        .peekable();
    if trace.peek().is_none() {
        return headers;
    }
    let mut table = headers.unwrap_or_default();
    for (name, value) in trace {
        table.insert(name.into(), long_string(value));
    }
    Some(table)
}

/// `s` as a property of at most 255 bytes (lapin panics on a longer one). Only a label
/// for other consumers: the envelope in the body keeps the whole text.
pub(crate) fn short_string(s: &str) -> ShortString {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    ShortString::from(&s[..end])
}

pub(crate) fn dead_headers(why: &str) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(H_REASON.into(), long_string(why));
    headers.insert(
        H_DEAD_AT.into(),
        AMQPValue::LongLongInt(Utc::now().timestamp_millis()),
    );
    headers
}

/// Deliveries of this message that ended without an ack, as the broker tells: a quorum
/// queue's `x-delivery-count`, or 1 for a classic queue's redelivery.
pub(crate) fn delivery_count(d: &Delivery) -> u32 {
    let counted = d.properties.headers().as_ref().and_then(|h| {
        h.inner()
            .get(&ShortString::from("x-delivery-count"))
            .cloned()
    });
    match counted {
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        _ => u32::from(d.redelivered),
    }
}

pub(crate) fn header_str(h: &Option<FieldTable>, key: &str) -> Option<String> {
    match h.as_ref()?.inner().get(&ShortString::from(key))? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The reason of the broker's own dead-lettering (`x-death`): `expired` for a TTL,
/// `delivery_limit` or `rejected` otherwise.
pub(crate) fn broker_death_reason(h: &Option<FieldTable>) -> Option<String> {
    let AMQPValue::FieldArray(deaths) = h.as_ref()?.inner().get(&ShortString::from("x-death"))?
    else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    match first.inner().get(&ShortString::from("reason"))? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

pub(crate) fn dead_letter_of(m: &BasicGetMessage, queue: &str) -> DeadLetter {
    let headers = m.delivery.properties.headers();
    let dead_at = match headers
        .as_ref()
        .and_then(|h| h.inner().get(&ShortString::from(H_DEAD_AT)).cloned())
    {
        Some(AMQPValue::LongLongInt(ms)) => DateTime::from_timestamp_millis(ms),
        _ => None,
    }
    .unwrap_or_else(Utc::now);
    // Dead-lettered by the broker itself (delivery limit, expiry): its x-death header.
    let why = header_str(headers, H_REASON)
        .or_else(|| broker_death_reason(headers))
        .unwrap_or_else(|| "delivery_limit".into());
    let text = String::from_utf8_lossy(&m.delivery.data).into_owned();
    match Envelope::from_json(&text) {
        Ok(env) => {
            let mut d = DeadLetter::new(env.id.to_string(), queue, why, dead_at);
            d.kind.clone_from(&env.kind);
            d.attempts = env.attempts;
            // A valid envelope quarantined (one of another queue) says why in a header.
            d.last_error = header_str(headers, H_ERROR).or_else(|| env.last_error.clone());
            d.ordering_key.clone_from(&env.ordering_key);
            d.envelope = Some(env);
            d
        }
        Err(_) => {
            let id = m
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            let mut d = DeadLetter::new(id, queue, why, dead_at);
            d.last_error = header_str(headers, H_ERROR);
            d.raw = Some(text);
            d
        }
    }
}
