use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// A logical queue name: 1–255 of ASCII letters, digits and `_ - . :`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueueName(String);

/// What a queue name may contain, for error messages.
const QUEUE_RULE: &str = "1 to 255 characters from letters, digits and _ - . :";

/// Whether `s` is 1 to `max` bytes of `A-Z a-z 0-9 _ - . :`, the characters of queue
/// names, labels and schedule names (each names its own rule in its error).
pub(crate) fn is_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

impl QueueName {
    /// Validates a queue name.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        if is_name(&name, 255) {
            Ok(QueueName(name))
        } else {
            Err(ConfigError::new("queue name", Some(name), QUEUE_RULE))
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for QueueName {
    type Error = ConfigError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        QueueName::new(value)
    }
}

impl TryFrom<&str> for QueueName {
    type Error = ConfigError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        QueueName::new(value)
    }
}

impl From<QueueName> for String {
    fn from(q: QueueName) -> String {
        q.0
    }
}

impl Deref for QueueName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A bare SQL identifier for a table or schema name: an ASCII letter or `_`, then up to
/// 62 letters, digits or `_`. Only validated identifiers are ever spliced into SQL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identifier(String);

impl Identifier {
    /// Validates `value` as the identifier for `setting` (named in the error).
    pub fn new(setting: &str, value: impl Into<String>) -> Result<Self, ConfigError> {
        let value = value.into();
        let mut bytes = value.bytes();
        let ok = value.len() <= 63
            && matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if ok {
            Ok(Identifier(value))
        } else {
            Err(ConfigError::new(
                setting,
                Some(value),
                "a bare SQL identifier: a letter or _, then up to 62 letters, digits or _",
            ))
        }
    }

    /// Validates `value` as the name of a queue table: an identifier short enough for
    /// the `_status`, `_tries`, `_procs`, `_dead`, `_claim`, `_due`, `_limits`, `_cancel`
    /// and other names derived from it (56 characters,
    /// so they stay within PostgreSQL's 63), and not itself such a derived name.
    pub fn table(setting: &str, value: impl Into<String>) -> Result<Self, ConfigError> {
        let id = Identifier::new(setting, value)?;
        let derived = [
            "_dead", "_claim", "_due", "_expiry", "_status", "_tries", "_procs", "_sfin", "_supd",
            "_unique", "_limits", "_holds", "_hjob", "_paused", "_cancel", "_waits", "_wfifo",
            "_sched", "_ckpt", "_logs",
        ]
        .iter()
        .find(|suffix| id.0.ends_with(*suffix));
        if id.0.len() > 56 || derived.is_some() {
            return Err(ConfigError::new(
                setting,
                Some(id.0),
                "a bare SQL identifier of at most 56 characters that does not end in _status, _tries, _procs, _dead, _claim, _due, _expiry, _sfin, _supd, _unique, _limits, _holds, _hjob, _paused, _cancel, _waits, _wfifo, _sched, _ckpt or _logs (those name the tables and indexes derived from it)",
            ));
        }
        Ok(id)
    }

    /// The identifier as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_follow_the_rule() {
        for ok in [
            "a",
            "emails",
            "tenant-1:invoices.v2",
            "x_y",
            &"q".repeat(255),
        ] {
            assert!(QueueName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "é", "q/1", "q;drop", &"q".repeat(256)] {
            let err = QueueName::new(bad).unwrap_err();
            assert!(err.to_string().contains("letters, digits"), "{err}");
        }
    }

    #[test]
    fn identifiers_are_bare_sql_names() {
        for ok in ["switchyard_jobs", "_t", "T1", &"a".repeat(63)] {
            assert!(Identifier::new("QUEUE_TABLE", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "a-b",
            "a b",
            "jobs;drop table x",
            "\"q\"",
            &"a".repeat(64),
        ] {
            let err = Identifier::new("QUEUE_TABLE", bad).unwrap_err();
            assert!(err.to_string().starts_with("invalid QUEUE_TABLE="), "{err}");
        }
    }

    #[test]
    fn table_names_leave_room_for_derived_names() {
        assert!(
            Identifier::table("QUEUE_TABLE", "select").is_ok(),
            "keywords are quoted"
        );
        assert!(Identifier::table("QUEUE_TABLE", "a".repeat(56)).is_ok());
        for bad in [
            "jobs_dead",
            "jobs_claim",
            "x_due",
            "jobs_status",
            "a".repeat(57).as_str(),
            "a b",
        ] {
            let err = Identifier::table("QUEUE_TABLE", bad).unwrap_err();
            assert!(err.to_string().contains("QUEUE_TABLE"), "{err}");
        }
    }
}
