//! A claim's mode and the rows it returns, as plainly as the backends read them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::values::attempts_u32;
use crate::envelope::Envelope;
use crate::time_units::time_from_micros;
use crate::transport::{Claim, Scope, Start};

/// Which claimed messages a claim marks started (the mode parameter of the claim SQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// None: claimed ahead of use (a prefetch).
    None = 0,
    /// All (a plain reserve).
    All = 1,
    /// Those that come with no attempts (a fast worker's prefetch).
    Fresh = 2,
    /// None, and the claim takes any row no worker holds, due or not (a move to another
    /// backend, [`Scope::Any`]).
    Move = 3,
}

impl StartMode {
    /// The mode of `claim`.
    pub fn of(claim: &Claim<'_>) -> Self {
        match (claim.scope, claim.start) {
            (Scope::Any, _) => StartMode::Move,
            (Scope::Due, Start::All) => StartMode::All,
            (Scope::Due, Start::None) => StartMode::None,
            (Scope::Due, Start::Fresh) => StartMode::Fresh,
        }
    }
}

/// Who claims, and which labels the claim selects: what a claim statement binds beside
/// its queue, limit, token and mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimBy<'a> {
    /// Recorded as the holder of each claimed row.
    pub holder: &'a str,
    /// The label filter as `,label,` needles, any of which matches; empty: any row.
    pub needles: Vec<String>,
}

impl<'a> ClaimBy<'a> {
    /// The holder and label filter of `claim`, its labels checked.
    pub fn of(claim: &Claim<'a>) -> crate::Result<Self> {
        for label in claim.labels {
            crate::labels::check_label(label)?;
        }
        Ok(ClaimBy {
            holder: claim.holder,
            needles: crate::labels::needles(claim.labels),
        })
    }
}

/// Which candidates one optimistic round takes: the `slot`th run of `want` among the
/// first `window` claimable rows in delivery order, or the window's last whole run when
/// it holds fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimisticSlice {
    /// How many claimable rows the round reads.
    pub window: usize,
    /// How many rows the round takes at most.
    pub want: usize,
    /// Which run of `want` rows it takes (0: the oldest).
    pub slot: usize,
}

impl OptimisticSlice {
    /// The rank (from 0) of the first row the slice takes in a window that held `seen`
    /// rows.
    pub fn first(&self, seen: usize) -> usize {
        let want = self.want.max(1);
        self.slot.min((seen / want).saturating_sub(1)) * want
    }

    /// How many rows the slice takes in a window that held `seen` rows.
    pub fn len(&self, seen: usize) -> usize {
        self.want.min(seen.saturating_sub(self.first(seen)))
    }
}

/// A claimed row, read as plainly as possible so that no stored value can fail a claim.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    /// The row number (publish order).
    pub seq: i64,
    /// The id column.
    pub id: String,
    /// The priority column.
    pub priority: i64,
    /// The attempts column, after the claim.
    pub attempts: i64,
    /// The due time, in microseconds since the epoch.
    pub available_at: i64,
    /// The last error column.
    pub last_error: Option<String>,
    /// The stored envelope text.
    pub envelope: Vec<u8>,
    /// Whether the claim marked the message started.
    pub started: bool,
}

impl ClaimedRow {
    /// The envelope, with the row's delivery state laid over it, or why the row is
    /// malformed.
    pub fn decode(&self) -> std::result::Result<Envelope, String> {
        let text = std::str::from_utf8(&self.envelope)
            .map_err(|e| format!("cannot decode envelope: not UTF-8 text ({e})"))?;
        let mut env = Envelope::from_json(text).map_err(|e| e.to_string())?;
        if env.id.to_string() != self.id {
            return Err(format!(
                "the envelope's id {} does not match the row's id {}",
                env.id, self.id
            ));
        }
        // The columns carry the delivery state; the JSON carries the message as published.
        env.attempts = attempts_u32(self.attempts);
        env.available_at = time_from_micros(self.available_at);
        env.last_error.clone_from(&self.last_error);
        Ok(env)
    }
}

/// How long a promotion of due rows counts as fresh.
const PROMOTE_EVERY: Duration = Duration::from_millis(50);

/// Paces the promotion of due rows (delayed messages, lapsed leases) into the claim
/// order, so that a busy drain does not pay for it on every batch, and notes whether the
/// last claim came back empty (every empty claim promotes).
#[derive(Debug, Default)]
pub struct PromotePacer {
    last: Mutex<Option<Instant>>,
    idle: AtomicBool,
}

impl PromotePacer {
    pub(super) fn recent(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < PROMOTE_EVERY)
    }

    /// Notes that a promotion runs now.
    pub fn mark(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether the last claim came back empty, forgetting it.
    pub(super) fn take_idle(&self) -> bool {
        self.idle.swap(false, Ordering::Relaxed)
    }

    /// Notes whether a claim came back empty.
    pub(super) fn set_idle(&self, empty: bool) {
        self.idle.store(empty, Ordering::Relaxed);
    }
}
