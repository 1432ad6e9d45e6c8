//! The worker's options.

use std::time::Duration;

use super::retry::RetryPolicy;

/// What the worker does with a message whose kind has no handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnknownKind {
    /// Dead-letter it with reason `no_handler` (the default).
    #[default]
    DeadLetter,
    /// Release it after this delay, for a newer worker that knows the kind.
    Release(Duration),
}

/// Options of a [`Worker`](crate::worker::Worker).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Handlers running at once.
    pub concurrency: usize,
    /// Messages claimed ahead of free handlers while handlers are fast (under 10 ms on
    /// average, that is at most about 256 × 10 ms / concurrency of work), so that one
    /// commit claims many messages. Their claim marks fresh ones started (see
    /// [`Start::Fresh`](crate::Start::Fresh)): if the worker dies, each is charged
    /// one attempt, never more. While handlers are slow nothing is prefetched, leaving the
    /// rest to other workers. Default 256.
    pub prefetch: usize,
    /// When to retry and how often.
    pub retry: RetryPolicy,
    /// A handler running longer is cancelled, and that counts as a failure.
    pub timeout: Option<Duration>,
    /// On shutdown, how long in-flight handlers may take before they are cancelled and
    /// their messages released.
    pub grace_period: Duration,
    /// The first pause after an empty reserve; doubles up to `poll_max`.
    pub poll_min: Duration,
    /// The longest pause between polls of an empty queue.
    pub poll_max: Duration,
    /// The most handled-but-unacknowledged messages held in memory; acks are committed
    /// in batches of up to this many.
    pub ack_batch: usize,
    /// Messages with an unknown kind.
    pub unknown_kind: UnknownKind,
    /// Exit once nothing is ready, delayed or reserved on the queue and nothing is in
    /// flight here (batch use and tests). A worker that selects labels exits at its
    /// first empty claim with nothing in flight: stats cannot tell its labels from others.
    pub drain: bool,
    /// The worker's name, recorded with `host:pid` as the holder of what it claims
    /// (`host:pid/name`), so that an operator can tell workers of one process apart.
    pub name: Option<String>,
    /// Claim only messages carrying one of these labels; empty (the default): every
    /// message. Backends without [`Capabilities::label_claims`](crate::Capabilities)
    /// refuse to start such a worker.
    pub labels: Vec<String>,
    /// The tenant whose store the worker's transport opened (see
    /// [`crate::tenants`]): told to handlers ([`JobContext::tenant`](super::JobContext::tenant))
    /// and put on the worker's metrics.
    pub tenant: Option<String>,
    /// Limits on how many of its jobs run at once or start per period, kept across
    /// every worker that declares the same (see [`crate::limit`]).
    pub limits: Vec<crate::limit::Limit>,
    /// Schedules stored when the worker starts (added, or changed keeping their
    /// cursors; see [`crate::schedule`]).
    pub schedules: Vec<crate::schedule::Schedule>,
    /// Whether the worker fires the due slots of its store's schedules (true; never
    /// while draining). Any number of workers may: each slot makes one job.
    pub fire_schedules: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 8,
            prefetch: 256,
            retry: RetryPolicy::default(),
            timeout: None,
            grace_period: Duration::from_secs(30),
            poll_min: Duration::from_millis(20),
            poll_max: Duration::from_secs(1),
            ack_batch: 256,
            unknown_kind: UnknownKind::DeadLetter,
            drain: false,
            schedules: Vec::new(),
            fire_schedules: true,
            name: None,
            labels: Vec::new(),
            tenant: None,
            limits: Vec::new(),
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency (at least 1).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sets how many messages may be claimed ahead of free handlers.
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the handler timeout.
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the shutdown grace period.
    pub fn with_grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// Sets the polling pauses of an idle worker.
    pub fn with_poll(mut self, min: Duration, max: Duration) -> Self {
        self.poll_min = min;
        self.poll_max = max.max(min);
        self
    }

    /// Sets the ack batch.
    pub fn with_ack_batch(mut self, n: usize) -> Self {
        self.ack_batch = n.max(1);
        self
    }

    /// Sets what happens to unknown kinds.
    pub fn with_unknown_kind(mut self, unknown: UnknownKind) -> Self {
        self.unknown_kind = unknown;
        self
    }

    /// Exits once the queue is empty.
    pub fn with_drain(mut self, drain: bool) -> Self {
        self.drain = drain;
        self
    }

    /// Names the worker (checked when it starts: 1 to 64 printable characters).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Claims only messages carrying one of `labels` (checked when the worker starts).
    pub fn with_labels<I, S>(mut self, labels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.labels = labels.into_iter().map(Into::into).collect();
        self
    }

    /// Adds limits its jobs keep (see [`crate::limit`]).
    pub fn with_limits(mut self, limits: impl IntoIterator<Item = crate::limit::Limit>) -> Self {
        self.limits.extend(limits);
        self
    }

    /// Adds schedules the worker stores when it starts (see [`crate::schedule`]).
    pub fn with_schedules(
        mut self,
        schedules: impl IntoIterator<Item = crate::schedule::Schedule>,
    ) -> Self {
        self.schedules.extend(schedules);
        self
    }

    /// Sets whether the worker fires due schedule slots.
    pub fn with_firing_schedules(mut self, fire: bool) -> Self {
        self.fire_schedules = fire;
        self
    }

    /// Names the tenant the worker serves (it serves whatever store its transport
    /// opened; this only tells handlers and metrics which one that is).
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }
}
