use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::{DecodeError, Error, Result};
use crate::names::QueueName;
use crate::unique::{OnConflict, Unique};

/// The wire format version this build reads and writes.
pub const ENVELOPE_VERSION: u32 = 1;

/// One message, in the v1 wire format shared by every backend, so that a message can move
/// between backends unchanged.
///
/// The payload is kept as the exact JSON text it was published with (`RawValue`), so it
/// round-trips byte for byte.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Envelope {
    /// Format version, always [`ENVELOPE_VERSION`].
    pub v: u32,
    /// Message id (UUID v7); publishing the same id twice stores one message.
    pub id: Uuid,
    /// Logical queue.
    pub queue: QueueName,
    /// Message type that selects the handler (`send_email`).
    pub kind: String,
    /// The application's data, as published.
    pub payload: Box<RawValue>,
    /// Deliveries so far that ended without an ack.
    pub attempts: u32,
    /// Per-message override of the worker's attempt limit.
    pub max_attempts: Option<u32>,
    /// Higher first.
    pub priority: i16,
    /// When the message was created.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: DateTime<Utc>,
    /// Not delivered before this instant (delayed when in the future).
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub available_at: DateTime<Utc>,
    /// Never delivered after this instant.
    #[serde(serialize_with = "crate::rfc3339::serialize_option")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Correlation id, propagated into tracing spans.
    pub trace_id: Option<String>,
    /// Small labels (tenant, origin, …).
    pub headers: BTreeMap<String, String>,
    /// The last failure's message, for operators.
    pub last_error: Option<String>,
    /// Labels a worker can select by (`Worker::labels`, `work --label`), sorted and
    /// without duplicates; left out of the JSON when empty, so that older readers and
    /// writers agree.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Messages of one queue with the same key are handled one at a time, in publish
    /// order, across every worker ([`Capabilities::ordering_keys`](crate::Capabilities)
    /// says how far each backend keeps it); left out of the JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// A key at most one job of the queue holds, and what a publish that finds it held
    /// does ([`Capabilities::unique_keys`](crate::Capabilities) says where it is kept);
    /// left out of the JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<Unique>,
}

impl Envelope {
    /// Starts a message for `queue` of type `kind`; see [`EnvelopeBuilder`].
    pub fn builder(queue: impl Into<String>, kind: impl Into<String>) -> EnvelopeBuilder {
        EnvelopeBuilder {
            queue: queue.into(),
            kind: kind.into(),
            payload: Ok(None),
            id: None,
            delay: None,
            available_at: None,
            expires: None,
            priority: 0,
            max_attempts: None,
            trace_id: None,
            headers: BTreeMap::new(),
            labels: Vec::new(),
            ordering_key: None,
            unique: None,
        }
    }

    /// Decodes a v1 envelope; an unknown version or a missing field is a [`DecodeError`].
    pub fn from_json(text: &str) -> Result<Envelope, DecodeError> {
        match serde_json::from_str::<Envelope>(text) {
            Ok(env) if env.v == ENVELOPE_VERSION => Ok(env),
            Ok(env) => Err(unsupported_version(u64::from(env.v))),
            Err(err) => {
                // Name the version problem rather than a missing field of another format.
                #[derive(Deserialize)]
                struct Version {
                    v: Option<serde_json::Value>,
                }
                match serde_json::from_str::<Version>(text) {
                    Ok(Version { v: Some(v) }) if v.as_u64() != Some(ENVELOPE_VERSION.into()) => {
                        Err(DecodeError::new(format!(
                            "unsupported envelope version {v} (this build reads version {ENVELOPE_VERSION})"
                        )))
                    }
                    _ => Err(DecodeError::new(err.to_string())),
                }
            }
        }
    }

    /// Encodes the envelope as one JSON document.
    pub fn to_json(&self) -> String {
        // Room for the fields around the payload from the start: grown from empty, the
        // text was copied five or six times on its way (every publish writes it). The
        // UTF-8 check below costs less than those copies, and needs no `unsafe`.
        let room = self.payload.get().len() + self.queue.as_str().len() + self.kind.len();
        let mut out = Vec::with_capacity(room + 320);
        // Serializing this struct cannot fail: every key is a string and the payload is
        // already valid JSON.
        serde_json::to_writer(&mut out, self).expect("an Envelope always serializes");
        String::from_utf8(out).expect("serde_json writes UTF-8")
    }

    /// Deserializes the payload into `T`.
    pub fn payload_as<'a, T: Deserialize<'a>>(&'a self) -> Result<T> {
        serde_json::from_str(self.payload.get()).map_err(|e| {
            Error::Decode(DecodeError::new(format!(
                "payload of message {} does not match the expected type: {e}",
                self.id
            )))
        })
    }

    /// Whether `expires_at` has passed at `now`.
    pub fn is_expired_at(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Checks what the builder checks of the fields a backend stores in columns of their
    /// own (labels, put in their stored order; the ordering key) before the message is
    /// stored: an envelope's fields are public, so it may not come from the builder. The
    /// error names the message.
    pub fn normalize_for_store(&mut self) -> Result<()> {
        let named = |e: Error| match e {
            Error::InvalidInput(why) => Error::InvalidInput(format!("message {}: {why}", self.id)),
            other => other,
        };
        if !self.labels.is_empty() {
            self.labels =
                crate::labels::normalize(std::mem::take(&mut self.labels)).map_err(named)?;
        }
        if let Some(key) = &self.ordering_key {
            check_ordering_key(key).map_err(named)?;
        }
        if let Some(unique) = &self.unique {
            check_unique(unique, self.ordering_key.is_some()).map_err(named)?;
        }
        Ok(())
    }

    /// Checks the encoded size against `limit`; the error names the message, the size and
    /// the limit.
    pub fn check_size(&self, limit: usize) -> Result<usize> {
        let size = self.to_json().len();
        if size > limit {
            return Err(Error::InvalidInput(format!(
                "message {} is {size} bytes encoded, over the limit of {limit} bytes; \
                 store large data elsewhere and send a reference",
                self.id
            )));
        }
        Ok(size)
    }
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        self.v == other.v
            && self.id == other.id
            && self.queue == other.queue
            && self.kind == other.kind
            && self.payload.get() == other.payload.get()
            && self.attempts == other.attempts
            && self.max_attempts == other.max_attempts
            && self.priority == other.priority
            && self.created_at == other.created_at
            && self.available_at == other.available_at
            && self.expires_at == other.expires_at
            && self.trace_id == other.trace_id
            && self.headers == other.headers
            && self.last_error == other.last_error
            && self.labels == other.labels
            && self.ordering_key == other.ordering_key
            && self.unique == other.unique
    }
}

/// Bytes in an ordering key.
pub const MAX_ORDERING_KEY_LEN: usize = 255;

/// Checks an ordering key: 1 to 255 bytes, no control characters, and no whitespace at
/// either end (MySQL's binary collation ignores trailing spaces, so `"k "` would be `"k"`
/// there).
pub fn check_ordering_key(key: &str) -> Result<()> {
    if key.is_empty()
        || key.len() > MAX_ORDERING_KEY_LEN
        || key.chars().any(char::is_control)
        || key.trim() != key
    {
        return Err(Error::InvalidInput(format!(
            "invalid ordering key {}: expected 1 to {MAX_ORDERING_KEY_LEN} bytes without control characters or whitespace at either end",
            crate::error::shown(key)
        )));
    }
    Ok(())
}

/// Checks a unique key's rules, and that a debounce does not move a message with an
/// ordering key (its due time is its place within its key's order).
fn check_unique(unique: &Unique, ordered: bool) -> Result<()> {
    unique.check()?;
    if ordered && unique.on_conflict == OnConflict::Replace {
        return Err(Error::InvalidInput(format!(
            "unique key {}: `replace` (debounce) cannot move a message with an ordering key; use `reject` or `throttle`, or leave out the ordering key",
            crate::error::shown(&unique.key)
        )));
    }
    Ok(())
}

fn unsupported_version(v: u64) -> DecodeError {
    DecodeError::new(format!(
        "unsupported envelope version {v} (this build reads version {ENVELOPE_VERSION})"
    ))
}

enum Expiry {
    In(Duration),
    At(DateTime<Utc>),
}

/// Builds an [`Envelope`]; [`build`](EnvelopeBuilder::build) validates everything.
#[derive(Debug)]
#[must_use]
pub struct EnvelopeBuilder {
    queue: String,
    kind: String,
    payload: Result<Option<Box<RawValue>>, String>,
    id: Option<Uuid>,
    delay: Option<Duration>,
    available_at: Option<DateTime<Utc>>,
    expires: Option<Expiry>,
    priority: i16,
    max_attempts: Option<u32>,
    trace_id: Option<String>,
    headers: BTreeMap<String, String>,
    labels: Vec<String>,
    ordering_key: Option<String>,
    unique: Option<Unique>,
}

impl std::fmt::Debug for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expiry::In(d) => write!(f, "in {d:?}"),
            Expiry::At(t) => write!(f, "at {t}"),
        }
    }
}

impl EnvelopeBuilder {
    /// Serializes `payload` as the message's data.
    pub fn payload<T: Serialize + ?Sized>(mut self, payload: &T) -> Self {
        self.payload = serde_json::value::to_raw_value(payload)
            .map(Some)
            .map_err(|e| format!("payload cannot be serialized as JSON: {e}"));
        self
    }

    /// Uses `json` verbatim as the payload; it must be one valid JSON value.
    pub fn raw_payload(mut self, json: impl Into<String>) -> Self {
        self.payload = RawValue::from_string(json.into())
            .map(Some)
            .map_err(|e| format!("payload is not valid JSON: {e}"));
        self
    }

    /// Sets the id; by default a fresh UUID v7.
    pub fn id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// Delays delivery by `delay`.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.available_at = None;
        self
    }

    /// Delays delivery until `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available_at = Some(at);
        self.delay = None;
        self
    }

    /// Never delivers the message after `ttl` from now.
    pub fn expires_in(mut self, ttl: Duration) -> Self {
        self.expires = Some(Expiry::In(ttl));
        self
    }

    /// Never delivers the message after `at`.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.expires = Some(Expiry::At(at));
        self
    }

    /// Higher is delivered first; default 0.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Overrides the worker's attempt limit for this message.
    pub fn max_attempts(mut self, max: u32) -> Self {
        self.max_attempts = Some(max);
        self
    }

    /// Sets the correlation id.
    pub fn trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// Adds a label (see [`crate::labels`]): workers that select labels claim the message
    /// when it carries one of theirs.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.labels.push(label.into());
        self
    }

    /// Sets the ordering key: messages of the queue with the same key are handled one
    /// at a time, in publish order (an order id, an account).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets a unique key ([`Unique`]): at most one job of the queue holds it, and a
    /// publish that finds it held is rejected, debounces or is throttled.
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// Validates and builds the envelope.
    pub fn build(self) -> Result<Envelope> {
        let queue = QueueName::new(self.queue)?;
        if self.kind.is_empty() || self.kind.len() > 255 || self.kind.chars().any(char::is_control)
        {
            return Err(Error::InvalidInput(format!(
                "invalid kind {}: expected 1 to 255 printable characters",
                crate::error::shown(&self.kind)
            )));
        }
        if self.max_attempts == Some(0) {
            return Err(Error::InvalidInput(
                "invalid max_attempts 0: expected at least 1".into(),
            ));
        }
        let payload = match self.payload.map_err(Error::InvalidInput)? {
            Some(p) => p,
            None => RawValue::from_string("null".into())
                .map_err(|e| Error::InvalidInput(e.to_string()))?,
        };
        let labels = crate::labels::normalize(self.labels)?;
        if let Some(key) = &self.ordering_key {
            check_ordering_key(key)?;
        }
        if let Some(unique) = &self.unique {
            check_unique(unique, self.ordering_key.is_some())?;
        }
        let now = Utc::now();
        let available_at = match (self.available_at, self.delay) {
            (Some(at), _) => at,
            (None, Some(d)) => after(now, d, "delay")?,
            (None, None) => now,
        };
        let expires_at = match self.expires {
            Some(Expiry::At(at)) => Some(at),
            Some(Expiry::In(d)) => Some(after(now, d, "expiry")?),
            None => None,
        };
        // Built inside a traced span: the job continues its trace.
        let mut headers = self.headers;
        let traced = crate::trace_context::inject_current(&mut headers);
        Ok(Envelope {
            v: ENVELOPE_VERSION,
            id: self.id.unwrap_or_else(Uuid::now_v7),
            queue,
            kind: self.kind,
            payload,
            attempts: 0,
            max_attempts: self.max_attempts,
            priority: self.priority,
            created_at: now,
            available_at,
            expires_at,
            trace_id: self.trace_id.or(traced),
            headers,
            last_error: None,
            labels,
            ordering_key: self.ordering_key,
            unique: self.unique,
        })
    }
}

/// `now + d`, or a clear error when that is past the end of representable time.
fn after(now: DateTime<Utc>, d: Duration, what: &str) -> Result<DateTime<Utc>> {
    chrono::TimeDelta::from_std(d)
        .ok()
        .and_then(|delta| now.checked_add_signed(delta))
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "{what} of {} is too long: expected at most about 100,000 years",
                humantime::format_duration(d)
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope::builder("emails", "send_email")
            .raw_payload(r#"{ "to" : "a@b.c",  "n": 1.50 }"#)
            .trace_id("t-1")
            .header("tenant", "acme")
            .priority(3)
            .build()
            .expect("valid envelope")
    }

    #[test]
    fn encoding_round_trips_the_payload_byte_for_byte() {
        let env = sample();
        let back = Envelope::from_json(&env.to_json()).expect("decodes");
        assert_eq!(back, env);
        assert_eq!(back.payload.get(), r#"{ "to" : "a@b.c",  "n": 1.50 }"#);
    }

    #[test]
    fn unknown_version_is_a_decode_error() {
        let text = sample().to_json().replace(r#""v":1"#, r#""v":2"#);
        let err = Envelope::from_json(&text).unwrap_err();
        assert!(
            err.reason.contains("unsupported envelope version 2"),
            "{err}"
        );
        let err = Envelope::from_json(r#"{"v":7,"other":"format"}"#).unwrap_err();
        assert!(err.reason.contains("version 7"), "{err}");
        let err = Envelope::from_json("not json").unwrap_err();
        assert!(err.reason.contains("expected"), "{err}");
    }

    #[test]
    fn builder_rejects_bad_input() {
        assert!(matches!(
            Envelope::builder("bad queue", "k").build(),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Envelope::builder("q", "").build(),
            Err(Error::InvalidInput(_))
        ));
        let err = Envelope::builder("q", "k")
            .raw_payload("{nope")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        for bad in ["", "k ", " k", "a\nb", &"x".repeat(256)] {
            let err = Envelope::builder("q", "k")
                .ordering_key(bad)
                .build()
                .expect_err(bad);
            assert!(err.to_string().contains("invalid ordering key"), "{err}");
        }
        let ok = Envelope::builder("q", "k").ordering_key("order 42").build();
        assert_eq!(ok.expect("a key").ordering_key.as_deref(), Some("order 42"));
    }

    #[test]
    fn absurd_delays_are_errors_not_panics() {
        let huge = Duration::from_secs(u64::MAX / 4);
        let err = Envelope::builder("q", "k").delay(huge).build().unwrap_err();
        assert!(err.to_string().contains("delay"), "{err}");
        let err = Envelope::builder("q", "k")
            .expires_in(huge)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("expiry"), "{err}");
    }

    #[test]
    fn builder_sets_delay_and_expiry() {
        let env = Envelope::builder("q", "k")
            .delay(Duration::from_secs(60))
            .expires_in(Duration::from_secs(120))
            .build()
            .expect("valid");
        assert!(env.available_at > env.created_at);
        assert!(env.expires_at.expect("set") > env.available_at);
        assert_eq!(env.id.get_version_num(), 7);
    }
}
