use std::fmt;

use uuid::Uuid;

/// Result with switchyard's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure a transport or the configuration can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid; raised before any I/O happens.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// A value handed to the library was rejected (payload too large, bad JSON, bad kind);
    /// nothing was written.
    #[error("{0}")]
    InvalidInput(String),

    /// The backend cannot do what was asked (a RabbitMQ store taking dead letters from
    /// another backend); nothing was changed.
    #[error("{0}")]
    NotSupported(String),

    /// What was asked conflicts with what is stored (a table of another schema, a
    /// name already taken); nothing was changed.
    #[error("{0}")]
    Conflict(String),

    /// A local I/O operation failed (a file, a socket, a signal handler).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and with what.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The reservation's lease is gone: it expired and another worker reserved the message,
    /// or the message was already acknowledged. Nothing was changed.
    #[error("lease lost for message {message_id}: it was re-reserved by another worker or is already gone")]
    LeaseLost {
        /// The message whose lease was lost.
        message_id: Uuid,
    },

    /// Stored or received data could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),

    /// The thing asked for does not exist (for example a dead letter id).
    #[error("{what} not found: {id}")]
    NotFound {
        /// What was looked for (`dead letter`).
        what: &'static str,
        /// The id that was looked for.
        id: String,
    },

    /// The backend failed (I/O, SQL, broker).
    #[error("{transport}: {source}")]
    Backend {
        /// Which transport failed (`sqlite`, `postgres`, …).
        transport: &'static str,
        /// Whether retrying the same call later may succeed.
        transient: bool,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// A backend error from a driver error.
    pub fn backend(
        transport: &'static str,
        transient: bool,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            transport,
            transient,
            source: source.into(),
        }
    }

    /// Whether retrying the same call later may succeed (connection lost, database busy).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Backend {
                transient: true,
                ..
            }
        )
    }

    /// Whether this is [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }
}

/// A configuration value that cannot be used: names the setting, the value (secrets
/// redacted) and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting, usually the environment variable (`QUEUE_BACKEND`).
    pub setting: String,
    /// The offending value, with any secret redacted; `None` when the value is absent.
    pub value: Option<String>,
    /// What is accepted instead.
    pub expected: String,
}

impl ConfigError {
    /// A new configuration error.
    pub fn new(
        setting: impl Into<String>,
        value: Option<String>,
        expected: impl Into<String>,
    ) -> Self {
        ConfigError {
            setting: setting.into(),
            value,
            expected: expected.into(),
        }
    }
}

/// How many characters of a rejected value an error message repeats.
const SHOWN_CHARS: usize = 64;

/// `value` quoted for an error message, cut to its first [`SHOWN_CHARS`] characters
/// (with `…` and the full length) so that a huge bad value cannot flood a log line or a
/// terminal.
pub(crate) fn shown(value: &str) -> String {
    let total = value.chars().count();
    if total <= SHOWN_CHARS {
        return format!("{value:?}");
    }
    let head: String = value.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}… ({total} characters)")
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(
                f,
                "invalid {}={}: {}",
                self.setting,
                shown(v),
                self.expected
            ),
            None => write!(f, "invalid {}: {}", self.setting, self.expected),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A stored or received message that is not a valid v1 envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode envelope: {reason}")]
pub struct DecodeError {
    /// Why decoding failed.
    pub reason: String,
}

impl DecodeError {
    /// A new decode error.
    pub fn new(reason: impl Into<String>) -> Self {
        DecodeError {
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_rejected_values_are_shown_cut_with_their_length() {
        assert_eq!(shown("abc"), "\"abc\"");
        let long = "x".repeat(5_000);
        let text = ConfigError::new("--queue", Some(long), "a queue name").to_string();
        assert!(text.len() < 200, "{text}");
        assert!(text.contains("… (5000 characters)"), "{text}");
    }
}
