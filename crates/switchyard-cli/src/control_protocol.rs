//! What an exec command and its worker say over the control socket
//! (`SWITCHYARD_CONTROL_SOCKET`): one JSON line each way, a progress report or a
//! checkpoint.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest request line read: a checkpoint of the largest size, escaped.
pub(crate) const MAX_LINE: u64 = 256 * 1024;

/// A request from a command.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    /// The job (`SWITCHYARD_MESSAGE_ID`).
    pub(crate) id: Uuid,
    /// Its lease token (`SWITCHYARD_LEASE_TOKEN`).
    pub(crate) token: String,
    /// Its tenant (`SWITCHYARD_TENANT`), when the worker serves several.
    #[serde(default)]
    pub(crate) tenant: Option<String>,
    /// Progress, 0 to 100.
    #[serde(default)]
    pub(crate) progress: Option<u8>,
    /// A short note on it.
    #[serde(default)]
    pub(crate) note: Option<String>,
    /// A checkpoint to store, as JSON text (a request carries progress or a
    /// checkpoint).
    #[serde(default)]
    pub(crate) checkpoint: Option<String>,
}

/// The answer: `{"ok": true}` or `{"error": "…"}`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Reply {
    #[serde(default)]
    pub(crate) ok: bool,
    #[serde(default)]
    pub(crate) error: Option<String>,
}
