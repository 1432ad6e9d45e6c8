/// The largest serialized envelope every backend accepts by default (8 MiB): small
/// enough for MySQL's default `max_allowed_packet` and RabbitMQ's default frame limits,
/// so a message can move between backends.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 8 * 1024 * 1024;

/// What a transport can promise. The conformance suite skips a case only where a
/// capability says the backend cannot do it, so this is the one place that lists what a
/// backend lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Messages of one priority are delivered in publish order.
    pub exact_fifo: bool,
    /// Higher priority is delivered first.
    pub priorities: bool,
    /// Delays are exact to the database clock (not rounded to levels).
    pub exact_delays: bool,
    /// `extend` renews a lease.
    pub lease_extension: bool,
    /// A lease runs out by the store's clock, and the message is then claimable again
    /// (counting an attempt if it was started). RabbitMQ holds a delivery until it is
    /// acked or its channel closes: no lease runs out there.
    pub lease_expiry: bool,
    /// A claim holds exactly what it returns, nothing ahead of it. A RabbitMQ consumer
    /// holds up to its prefetch (`basic.qos`) by design.
    pub exact_claims: bool,
    /// Publishing an id that is already stored stores nothing new.
    pub idempotent_publish: bool,
    /// The transport itself never delivers a message past its `expires_at` (by its own
    /// clock); otherwise the worker checks.
    pub expiry: bool,
    /// Several stores (tables) can live side by side in one database.
    pub table_isolation: bool,
    /// Publish can join the caller's own database transaction.
    pub transactional_publish: bool,
    /// [`Transport::wake_signal`](crate::Transport::wake_signal) gives a signal: always
    /// for publishes through the same transport value, and from other processes where
    /// the backend can tell (PostgreSQL's `LISTEN`, MySQL's publish watch, RabbitMQ's
    /// consumers; not SQLite, whose workers poll for those).
    pub wake_signal: bool,
    /// Stats count every message of a queue that is not yet due. RabbitMQ keeps them in
    /// a delay chain shared by every queue and counts only those its own process
    /// delayed.
    pub delayed_stats: bool,
    /// A crash charges an attempt only to messages whose handler was started (or was
    /// about to be): the store tells a started message from one merely claimed ahead.
    /// RabbitMQ can tell only with start marks in a SQL control store beside it;
    /// without one, every delivery a dead consumer held comes back counted.
    pub charges_only_started: bool,
    /// Start marks live in the transport's status store: a worker over it records job
    /// status there (so that each mark is closed by the job's end) even when not asked
    /// to.
    pub start_marks_in_status: bool,
    /// A claim can select messages by label ([`Claim::labels`](crate::Claim)). A
    /// RabbitMQ queue hands out messages in its own order, so a consumer cannot pass
    /// over the ones it does not want; give such work its own queue there.
    pub label_claims: bool,
    /// Every claim records who holds the message and until when, and
    /// [`Holdings::held`](crate::Holdings::held) lists them. RabbitMQ knows which
    /// connection holds a delivery but does not say which message; the connection's
    /// name carries the holder instead.
    pub holders: bool,
    /// Messages of one queue with the same ordering key are handled one at a time, in
    /// publish order, across every worker and process, a retry holding its key until it
    /// succeeds or is dead-lettered, and delays applying within the order. The SQL
    /// backends keep it in the claim. RabbitMQ keeps it per partition queue with a
    /// single active consumer, and not across delays (see its crate's documentation).
    pub ordering_keys: bool,
    /// Unique keys ([`Unique`](crate::Unique)): at most one job of a queue holds a key
    /// while its scope lasts, a second publish is rejected, debounces or is throttled,
    /// and concurrent publishers of a key are serialised. The SQL backends keep each
    /// key's holder in a table beside the queue's, in the publish's own transaction.
    pub unique_keys: bool,
    /// A unique key's `replace` rule (debounce) moves a waiting job: RabbitMQ cannot
    /// change a message it already queues.
    pub unique_replace: bool,
    /// Workers' limits ([`Limit`](crate::Limit)) can be kept: their slots and buckets
    /// live in the SQL store beside the jobs (its status store), for RabbitMQ in its
    /// control store. A worker with limits needs that store
    /// ([`Worker::for_jobs`](crate::worker::Worker::for_jobs)).
    pub limits: bool,
    /// A job that finds every slot of a concurrency limit taken is set aside out of the
    /// claim order and woken by the release of a slot (the SQL backends, whose limit
    /// store sits beside the jobs). RabbitMQ cannot set a queued message aside: a denied
    /// job goes back through the delay chain and is claimed again after its wait.
    pub limit_parking: bool,
    /// A run's checkpoint ([`JobContext::checkpoint`](crate::worker::JobContext::checkpoint))
    /// can be fenced in the status store: by the job row's lease token (the SQL
    /// backends), or by the start mark of its attempt (RabbitMQ with its control store).
    /// Not through the migration router, whose two sides fence their runs differently.
    pub checkpoints: bool,
    /// The transport keeps upkeep of its own (expired messages to the dead-letter store,
    /// ordering keys whose head left, unique keys that hold nothing), which
    /// [`Transport::maintain`](crate::Transport::maintain) runs: a worker calls it in the
    /// background so that it is not done inside its claims. Elsewhere the broker keeps
    /// its queues itself. A wrapper that passes this on must pass `maintain` on too.
    pub upkeep: bool,
    /// The largest serialized envelope accepted, in bytes.
    pub max_payload_bytes: usize,
}

impl Capabilities {
    /// Whether a message's unique key and its rule can be kept here (a relay or a move
    /// forwards the message without it where not).
    pub fn keeps_unique(&self, unique: &crate::Unique) -> bool {
        self.unique_keys
            && (unique.on_conflict != crate::OnConflict::Replace || self.unique_replace)
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            exact_fifo: false,
            priorities: false,
            exact_delays: false,
            lease_extension: false,
            lease_expiry: false,
            exact_claims: false,
            idempotent_publish: false,
            expiry: false,
            table_isolation: false,
            transactional_publish: false,
            label_claims: false,
            holders: false,
            ordering_keys: false,
            unique_keys: false,
            unique_replace: false,
            limits: false,
            limit_parking: false,
            checkpoints: false,
            upkeep: false,
            wake_signal: false,
            delayed_stats: false,
            charges_only_started: false,
            start_marks_in_status: false,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}
