//! What a SQL backend provides to the engine: its statements, run its own way (MySQL's
//! cursor, tombstones and lock retries; SQLite's single writer; PostgreSQL's `NOTIFY` and
//! kept connections), and nothing of the logic around them.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::claimed::{ClaimBy, ClaimedRow, OptimisticSlice, PromotePacer, StartMode};
use super::unique::KeyHold;
use super::wakers::Wakers;
use crate::config::ClaimStrategy;
use crate::dead_letters::DeadLetter;
use crate::envelope::Envelope;
use crate::error::Result;
use crate::names::QueueName;
use crate::published::Published;
use crate::reservation::{AckReport, LeaseToken, Reservation};

/// The engine's state inside a backend's transport: the idle workers' wake-up signals,
/// the pacing of promotion and of the upkeep (and whether a worker has taken the upkeep
/// over from the claims), and the optimistic claims' counts.
#[derive(Debug, Default)]
pub struct EngineState {
    /// The idle workers' wake-up signals.
    pub wakers: std::sync::Arc<Wakers>,
    pub(super) pacer: PromotePacer,
    pub(super) last_sweep: Mutex<Option<Instant>>,
    /// When the key repair last ran, and whether an expiry sweep since asked for it.
    pub(super) key_repair: Mutex<(Option<Instant>, bool)>,
    /// When a worker last called for the upkeep, and since when an upkeep call has been
    /// under way: while either is recent, claims leave the upkeep to the workers.
    pub(super) upkeep: Mutex<Upkeep>,
    /// What optimistic claims lost to competitors.
    pub claims: super::ClaimTally,
}

impl EngineState {
    /// State whose wake-ups go to `wakers` (shared with a listener task).
    pub fn with_wakers(wakers: std::sync::Arc<Wakers>) -> Self {
        EngineState {
            wakers,
            ..EngineState::default()
        }
    }
}

/// Who does the upkeep: see [`EngineState::upkeep`].
#[derive(Debug, Default)]
pub(super) struct Upkeep {
    /// When a worker last called for it.
    pub(super) called: Option<Instant>,
    /// Since when a call has been doing it, if one is.
    pub(super) busy_since: Option<Instant>,
}

/// A batch statement over the (row, token) pairs of reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairOp {
    /// Delete the rows: an ack.
    Ack,
    /// Mark the rows started and renew their leases by this many microseconds.
    Start(i64),
}

/// A statement on one leased row, fenced by its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp<'a> {
    /// Back to the queue for a retry: `attempts + 1`, due after this many microseconds,
    /// with this last error.
    Release(i64, Option<&'a str>),
    /// Back to the queue without counting an attempt, due after this many microseconds
    /// (a snooze); the last error is kept.
    Snooze(i64),
    /// Back to the queue unstarted: due now, no attempt counted.
    Abandon,
    /// Renew the lease by this many microseconds.
    Extend(i64),
}

/// One queue's counts of waiting messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsRow {
    /// The queue.
    pub queue: String,
    /// Due and not leased.
    pub ready: u64,
    /// Not yet due.
    pub delayed: u64,
    /// Leased.
    pub reserved: u64,
    /// Age of the oldest ready message, in microseconds.
    pub oldest_ready_us: Option<i64>,
}

/// A dead-letter row as stored.
#[derive(Debug, Clone)]
pub struct DeadRow {
    /// The id column (any text for a malformed row).
    pub id: String,
    /// The queue column.
    pub queue: String,
    /// The kind column.
    pub kind: String,
    /// The attempts column.
    pub attempts: i64,
    /// The reason column.
    pub reason: String,
    /// The last error column.
    pub last_error: Option<String>,
    /// When it died, in microseconds since the epoch.
    pub dead_at_us: i64,
    /// The stored text: an envelope, or a malformed row's raw text.
    pub body: String,
}

/// A held row as stored.
#[derive(Debug, Clone)]
pub struct HeldRow {
    /// The id column.
    pub id: String,
    /// The queue column.
    pub queue: String,
    /// The kind column.
    pub kind: String,
    /// Who claimed it.
    pub holder: Option<String>,
    /// When, in microseconds since the epoch.
    pub claimed_at_us: Option<i64>,
    /// The lease's end, in microseconds since the epoch.
    pub lease_until_us: i64,
    /// Whether a handler started it.
    pub started: bool,
    /// The attempts column.
    pub attempts: i64,
}

/// What a replay moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replayed {
    /// How many dead letters went back to their queues.
    pub count: u64,
    /// The queues they went to, or `None` when the backend cannot tell (all are woken).
    pub queues: Option<Vec<String>>,
}

/// The primitives of one SQL backend. Implementing it makes a type a
/// [`Transport`](crate::Transport) and [`DeadLetters`](crate::DeadLetters) through the
/// engine, which keeps the logic of the contract (claim loops, quarantine, sweep pacing,
/// fencing, stats and dead-letter assembly) in one place.
#[async_trait]
pub trait SqlBackend: Send + Sync + fmt::Debug {
    /// Short backend name for logs and errors (`postgres`).
    fn name(&self) -> &'static str;

    /// The largest serialized envelope accepted.
    fn max_payload_bytes(&self) -> usize;

    /// The lease a claim takes (`QUEUE_VISIBILITY_TIMEOUT`).
    fn lease(&self) -> Duration;

    /// How claims take rows.
    fn claim_strategy(&self) -> ClaimStrategy;

    /// The engine's state.
    fn engine(&self) -> &EngineState;

    /// Starts whatever tells this process of other processes' publishes (PostgreSQL's
    /// `LISTEN`, MySQL's and SQLite's publish watch), once a worker asks for a wake-up
    /// signal.
    fn watch_publishes(&self) {}

    /// Stores envelopes atomically, skipping ids already stored; validates each one's
    /// size before storing any.
    async fn insert(&self, envelopes: Vec<Envelope>) -> Result<()>;

    /// Stores envelopes of which some carry unique keys (already validated), in one
    /// transaction: the others as [`insert`](Self::insert) would, each one with a key
    /// through [`publish_unique`](super::unique::publish_unique).
    async fn insert_unique(&self, envelopes: Vec<Envelope>) -> Result<Published>;

    /// Holds the keys of jobs about to be acked for their `done` period, each only
    /// while its job is still held under its token.
    async fn hold_keys(&self, holds: &[KeyHold]) -> Result<()>;

    /// Deletes up to 1,000 unique-key rows that hold nothing any more; how many.
    async fn prune_keys(&self) -> Result<u64>;

    /// One statement (or transaction) that claims up to `max` rows of `queue` under
    /// `token`: skipping rows other claims lock, or for a move (`StartMode::Move`) any
    /// row no worker holds.
    async fn claim_locked(
        &self,
        queue: &QueueName,
        max: usize,
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>>;

    /// The candidates of an optimistic claim: up to `window` seqs of claimable rows of
    /// `queue`, in delivery order, read without locks.
    async fn optimistic_candidates(
        &self,
        queue: &QueueName,
        window: usize,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<i64>>;

    /// The compare-and-set of an optimistic claim: claims those of `seqs` (rows of
    /// `queue`) that are still claimable, in one statement or transaction that commits,
    /// and skips the others.
    async fn optimistic_take(
        &self,
        queue: &QueueName,
        seqs: &[i64],
        token: LeaseToken,
        start: StartMode,
        by: &ClaimBy<'_>,
    ) -> Result<Vec<ClaimedRow>>;

    /// An optimistic round in one statement, for a backend that can read the candidates
    /// and compare-and-set a slice of them at once: half the round trips, and only the
    /// time within one statement for a competitor to take the rows first. Returns how
    /// many candidates the window held, and the rows of the slice that were still
    /// claimable. `None` (the default): the backend reads and takes apart.
    async fn optimistic_round(
        &self,
        _queue: &QueueName,
        _slice: OptimisticSlice,
        _token: LeaseToken,
        _start: StartMode,
        _by: &ClaimBy<'_>,
    ) -> Result<Option<(usize, Vec<ClaimedRow>)>> {
        Ok(None)
    }

    /// Moves waiting rows whose time has come (due delays, lapsed leases) into the claim
    /// order; how many.
    async fn promote_due(&self) -> Result<u64>;

    /// Moves unleased expired rows to the dead-letter store; how many.
    async fn sweep_expired(&self) -> Result<u64>;

    /// Moves the row `seq` held under `token` to the dead-letter store, byte for byte,
    /// and hands its ordering key (`key`: its queue and key, when the message has one) to
    /// the next message of the key; `false` when the lease is gone.
    async fn move_to_dead(
        &self,
        seq: i64,
        token: LeaseToken,
        reason: &str,
        error: Option<&str>,
        key: Option<(&str, &str)>,
    ) -> Result<bool>;

    /// Hands each ordering key whose head left without handing it on (an expired head, a
    /// quarantined one, a mover that died) to its next message; how many. A backstop:
    /// acks and dead letters hand keys on themselves.
    async fn repair_keys(&self) -> Result<u64>;

    /// Runs `op` on the rows of `reservations` still held under their tokens.
    async fn by_pairs(&self, op: PairOp, reservations: &[Reservation]) -> Result<AckReport>;

    /// Runs `op` on the reservation's row if its token still holds it; whether it did.
    async fn on_lease(&self, op: LeaseOp<'_>, reservation: &Reservation) -> Result<bool>;

    /// Counts of waiting messages per queue, and of dead letters per queue.
    async fn stats_rows(
        &self,
        queue: Option<&QueueName>,
    ) -> Result<(Vec<StatsRow>, Vec<(String, u64)>)>;

    /// Up to `limit` rows held under a lease that has not run out (of `queue`, or the row
    /// `id`, when given), longest held first.
    async fn held_rows(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HeldRow>>;

    /// Up to `limit` dead-letter rows, oldest first.
    async fn dead_rows(&self, queue: Option<&QueueName>, limit: usize) -> Result<Vec<DeadRow>>;

    /// Moves the selected dead letters (by id, or dead longer ago than `age_us`, or all)
    /// back to their queues.
    async fn replay_dead(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        age_us: Option<i64>,
    ) -> Result<Replayed>;

    /// Whether a dead letter with this id exists.
    async fn dead_exists(&self, id: &str) -> Result<bool>;

    /// Deletes the selected dead letters; how many.
    async fn purge_dead(
        &self,
        queue: Option<&QueueName>,
        id: Option<&str>,
        age_us: Option<i64>,
    ) -> Result<u64>;

    /// Stores dead letters moved from another backend, as they are.
    async fn insert_dead(&self, letters: &[DeadLetter]) -> Result<()>;
}
