//! Core of switchyard: the v1 [`Envelope`], the [`Transport`] trait that every backend
//! implements, the [`Error`] type, configuration from the environment and the shared
//! conformance suite (feature `conformance`).
//!
//! Applications normally depend on the `switchyard` facade crate, which re-exports
//! everything here and selects backends with Cargo features.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod capabilities;
pub mod checkpoint;
mod config;
pub mod connect;
mod controls;
mod dead_letters;
mod envelope;
mod error;
mod history;
mod holdings;
pub mod inbox;
pub mod job_log;
mod job_state;
mod key_store;
pub mod labels;
pub mod limit;
mod limit_store;
pub mod metrics;
mod names;
mod published;
mod redact;
mod registry;
mod reservation;
mod rfc3339;
pub mod schedule;
pub mod sql;
pub mod stable_hash;
pub mod status;
pub mod tenants;
pub mod text;
mod time_units;
pub mod trace_context;
mod transport;
mod transport_ext;
mod unique;
pub mod worker;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;

pub use capabilities::{Capabilities, DEFAULT_MAX_PAYLOAD_BYTES};
pub use config::{
    parse_duration, BackendKind, ClaimStrategy, Config, DrainSetting, DEFAULT_VISIBILITY_TIMEOUT,
};
pub use controls::{Controls, Paused};
pub use dead_letters::{DeadLetter, DeadLetters, DeadSelection};
pub use envelope::{
    check_ordering_key, Envelope, EnvelopeBuilder, ENVELOPE_VERSION, MAX_ORDERING_KEY_LEN,
};
pub use error::{ConfigError, DecodeError, Error, Result};
pub use holdings::{HeldSelection, Holding, Holdings};
pub use key_store::UniqueKeyStore;
pub use limit::{Acquired, Denial, Limit, LimitBy, LimitUsage, Rate, Want};
pub use limit_store::{LimitLease, LimitStore, Parked};
pub use names::{Identifier, QueueName};
pub use published::{Duplicate, Published};
pub use redact::{redact_url, split_url_list, unsupported_secret_param, SecretUrl};
pub use reservation::{AckReport, LeaseToken, Receipt, Reservation};
pub use transport::{Claim, GiveBack, QueueStats, Scope, Start, Transport};
pub use transport_ext::TransportExt;
pub use unique::{OnConflict, Unique, UniqueScope, MAX_UNIQUE_KEY_LEN};

pub use tokio_util::sync::CancellationToken;

/// Dead-letter reasons written by switchyard itself.
pub mod reason {
    /// The stored row could not be decoded as a v1 envelope.
    pub const MALFORMED: &str = "malformed";
    /// The message passed its `expires_at` before it could be delivered.
    pub const EXPIRED: &str = "expired";
    /// No handler is registered for the message's kind.
    pub const NO_HANDLER: &str = "no_handler";
    /// The handler failed and the attempts ran out.
    pub const MAX_ATTEMPTS: &str = "max_attempts";
    /// The handler asked to fail at once.
    pub const FAILED: &str = "failed";
    /// A relay's destination cannot keep what the message asks for (an ordering key on
    /// RabbitMQ), so it was not forwarded.
    pub const UNSUPPORTED: &str = "unsupported";
}
