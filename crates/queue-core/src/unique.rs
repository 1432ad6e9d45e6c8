//! Unique jobs: a key that at most one job of a queue holds, for as long as its scope
//! says, and what a publish does when it finds the key held (reject, replace: debounce,
//! or throttle).
//!
//! The key is not a lock that a crash could leave behind: a SQL store keeps, per queue
//! and key, which job holds it, and whether that job still holds it is read from the
//! job's own row when a publish meets the key (see [`crate::sql::unique`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest period, max_wait or ttl, in ms (100 years): a store adds it to its clock.
const MAX_MS: u64 = 100 * 366 * 24 * 60 * 60 * 1000;

/// Bytes in a unique key.
pub const MAX_UNIQUE_KEY_LEN: usize = 255;

/// How long a job holds its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UniqueScope {
    /// While no worker has claimed it: a claimed job frees the key, so an event that
    /// arrives while the job runs enqueues the next run.
    Pending,
    /// While pending or running (until its ack or dead letter); the default.
    Active,
    /// While pending or running, and for [`Unique::period`] after its ack.
    Done,
}

/// What a publish that finds the key held does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Stores nothing; the publish reports the job that holds the key.
    Reject,
    /// Debounce: when the holder has not been claimed, its payload and headers become
    /// this message's and its due time moves to this message's, but never past
    /// [`Unique::max_wait`] after the holder was first published.
    Replace,
    /// Stores nothing, and the key stays held for [`Unique::ttl`] after its holder was
    /// published even once that job is done: at most one job per `ttl`.
    Throttle,
}

/// A message's unique key and its rules (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Unique {
    /// The key, unique per queue: 1 to 255 bytes, no control characters, no whitespace
    /// at either end.
    pub key: String,
    /// How long the job holds the key.
    pub scope: UniqueScope,
    /// What a publish that finds the key held does.
    pub on_conflict: OnConflict,
    /// [`UniqueScope::Done`]: how long the key stays held after the ack, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// [`OnConflict::Replace`]: the latest a debounced job may become due, in ms after
    /// its first publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// [`OnConflict::Throttle`]: how long after a publish the key stays held, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl Unique {
    /// A key held while the job is pending or running; a second publish is rejected.
    pub fn new(key: impl Into<String>) -> Self {
        Unique {
            key: key.into(),
            scope: UniqueScope::Active,
            on_conflict: OnConflict::Reject,
            period_ms: None,
            max_wait_ms: None,
            ttl_ms: None,
        }
    }

    /// Debounce: each publish while the job waits moves its due time to the newest
    /// publish's (give each a [`delay`](crate::EnvelopeBuilder::delay)) and replaces its
    /// payload and headers, but the job becomes due no later than `max_wait` after the
    /// first publish. The key is held only while the job is pending, so an event that
    /// arrives while it runs enqueues the next run.
    pub fn debounce(key: impl Into<String>, max_wait: Duration) -> Self {
        Unique::new(key).while_pending().replace(max_wait)
    }

    /// At most one job per `ttl`: publishes within `ttl` of the one that took the key
    /// are rejected, whether that job is still waiting, running or done.
    pub fn throttle(key: impl Into<String>, ttl: Duration) -> Self {
        Unique::new(key).throttled(ttl)
    }

    /// Holds the key only until a worker claims the job.
    pub fn while_pending(mut self) -> Self {
        self.scope = UniqueScope::Pending;
        self.period_ms = None;
        self
    }

    /// Holds the key until the job's ack or dead letter (the default).
    pub fn while_active(mut self) -> Self {
        self.scope = UniqueScope::Active;
        self.period_ms = None;
        self
    }

    /// Holds the key until the job's ack and for `period` after it (a dead letter frees
    /// it at once).
    pub fn until_done_for(mut self, period: Duration) -> Self {
        self.scope = UniqueScope::Done;
        self.period_ms = Some(millis(period));
        self
    }

    /// A publish that finds the key held stores nothing (the default).
    pub fn reject(mut self) -> Self {
        self.on_conflict = OnConflict::Reject;
        self.max_wait_ms = None;
        self.ttl_ms = None;
        self
    }

    /// A publish that finds the key held by a job no worker has claimed replaces it,
    /// moving its due time no later than `max_wait` after its first publish.
    pub fn replace(mut self, max_wait: Duration) -> Self {
        self.on_conflict = OnConflict::Replace;
        self.max_wait_ms = Some(millis(max_wait));
        self.ttl_ms = None;
        self
    }

    /// A publish within `ttl` of the one that took the key stores nothing.
    pub fn throttled(mut self, ttl: Duration) -> Self {
        self.on_conflict = OnConflict::Throttle;
        self.ttl_ms = Some(millis(ttl));
        self.max_wait_ms = None;
        self
    }

    /// How long the key stays held after the ack ([`UniqueScope::Done`]).
    pub fn period(&self) -> Option<Duration> {
        (self.scope == UniqueScope::Done)
            .then(|| Duration::from_millis(self.period_ms.unwrap_or(0)))
    }

    /// The latest a debounced job becomes due after its first publish
    /// ([`OnConflict::Replace`]).
    pub fn max_wait(&self) -> Option<Duration> {
        (self.on_conflict == OnConflict::Replace)
            .then(|| Duration::from_millis(self.max_wait_ms.unwrap_or(0)))
    }

    /// How long after a publish the key stays held ([`OnConflict::Throttle`]).
    pub fn ttl(&self) -> Option<Duration> {
        (self.on_conflict == OnConflict::Throttle)
            .then(|| Duration::from_millis(self.ttl_ms.unwrap_or(0)))
    }

    /// Checks the key and that each rule has its duration; the error says what is
    /// accepted.
    pub fn check(&self) -> Result<()> {
        let key = &self.key;
        if key.is_empty()
            || key.len() > MAX_UNIQUE_KEY_LEN
            || key.chars().any(char::is_control)
            || key.trim() != key
        {
            return Err(Error::InvalidInput(format!(
                "invalid unique key {}: expected 1 to {MAX_UNIQUE_KEY_LEN} bytes without control characters or whitespace at either end",
                crate::error::shown(key)
            )));
        }
        let missing = |what: &str, rule: &str| {
            Err(Error::InvalidInput(format!(
                "unique key {}: {rule} needs a {what} of at least 1 ms",
                crate::error::shown(key)
            )))
        };
        if self.scope == UniqueScope::Done && self.period_ms.unwrap_or(0) == 0 {
            return missing("period", "the scope `done`");
        }
        if self.on_conflict == OnConflict::Replace && self.max_wait_ms.unwrap_or(0) == 0 {
            return missing("max_wait", "`replace` (debounce)");
        }
        if self.on_conflict == OnConflict::Throttle && self.ttl_ms.unwrap_or(0) == 0 {
            return missing("ttl", "`throttle`");
        }
        for (what, ms) in [
            ("period", self.period_ms),
            ("max_wait", self.max_wait_ms),
            ("ttl", self.ttl_ms),
        ] {
            if ms.is_some_and(|ms| ms > MAX_MS) {
                return Err(Error::InvalidInput(format!(
                    "unique key {}: a {what} of at most 100 years is accepted",
                    crate::error::shown(key)
                )));
            }
        }
        Ok(())
    }
}

/// Whole milliseconds, at least 1 for any non-zero duration, saturating.
fn millis(d: Duration) -> u64 {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 && !d.is_zero() {
        1
    } else {
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_need_their_durations_and_keys_are_checked() {
        assert!(Unique::new("account-42").check().is_ok());
        assert!(Unique::debounce("a", Duration::from_secs(30))
            .check()
            .is_ok());
        assert!(Unique::throttle("a", Duration::from_secs(300))
            .check()
            .is_ok());
        for bad in [
            Unique::new(""),
            Unique::new(" a"),
            Unique::new("a\n"),
            Unique::new("x".repeat(256)),
            Unique::new("a").replace(Duration::ZERO),
            Unique::new("a").throttled(Duration::ZERO),
            Unique::new("a").until_done_for(Duration::ZERO),
            Unique::new("a").until_done_for(Duration::MAX),
        ] {
            let err = bad.check().expect_err("refused").to_string();
            assert!(err.contains("unique key"), "{err}");
        }
    }

    #[test]
    fn the_json_leaves_out_what_a_rule_does_not_use() {
        let json = serde_json::to_string(&Unique::new("k")).expect("serializes");
        assert_eq!(
            json,
            r#"{"key":"k","scope":"active","on_conflict":"reject"}"#
        );
        let debounce = Unique::debounce("k", Duration::from_millis(1500));
        let back: Unique =
            serde_json::from_str(&serde_json::to_string(&debounce).expect("serializes"))
                .expect("decodes");
        assert_eq!(back, debounce);
        assert_eq!(back.max_wait(), Some(Duration::from_millis(1500)));
        assert_eq!(back.scope, UniqueScope::Pending);
    }
}
