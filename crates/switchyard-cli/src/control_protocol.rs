//! What an exec command and its worker say over the control socket
//! (`SWITCHYARD_CONTROL_SOCKET`): one JSON line each way.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest request line read.
pub(crate) const MAX_LINE: u64 = 64 * 1024;

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
    pub(crate) progress: u8,
    /// A short note on it.
    #[serde(default)]
    pub(crate) note: Option<String>,
}

/// The answer: `{"ok": true}` or `{"error": "…"}`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Reply {
    #[serde(default)]
    pub(crate) ok: bool,
    #[serde(default)]
    pub(crate) error: Option<String>,
}
