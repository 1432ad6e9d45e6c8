use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::envelope::Envelope;
use crate::reservation::LeaseToken;
use crate::status::{StatusUpdate, StatusWriter};

/// What a handler gets for one delivery.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobContext {
    /// The message.
    pub envelope: Envelope,
    /// This delivery's number, 1 for the first.
    pub attempt: u32,
    /// The attempt limit that applies to this message.
    pub max_attempts: u32,
    /// The lease token: guard downstream writes with it (store it beside what the job
    /// writes and refuse writes under an older token) to fence a worker that lost its
    /// lease.
    pub lease_token: LeaseToken,
    /// Fires when the job must stop: its lease was lost, it timed out, or the worker is
    /// shutting down past its grace period. Long handlers should check it; half a second
    /// later the handler is aborted.
    pub cancel: CancellationToken,
    /// Fires when the worker starts shutting down: finish or checkpoint within the grace
    /// period. It is the run's own child of the token given to `run`: a handler that
    /// cancels it stops this run only, never the caller's token or other workers on it.
    pub shutdown: CancellationToken,
    pub(crate) report: Report,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) freshness: super::freshness::Freshness,
    /// Where this run's checkpoint goes, when the worker keeps them.
    pub(crate) checkpoint: Option<crate::checkpoint::JobCheckpoint>,
    /// This run's log lines, when the worker keeps them.
    pub(crate) log: Option<crate::job_log::JobLog>,
}

/// Where a handler's progress and result go.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) writer: Option<StatusWriter>,
    pub(crate) result: Arc<Mutex<Option<Value>>>,
}

impl JobContext {
    /// The tenant whose store the message came from, when the worker serves one
    /// ([`WorkerOptions::with_tenant`](super::WorkerOptions::with_tenant); the command
    /// line sets it from `--schema`).
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Whether this run surely still holds its lease and limit slots: each renewed within
    /// half its length. False after the worker was stopped or starved past that (a
    /// frozen process learns of a lost lease only at its next heartbeat's answer):
    /// check it right before a side effect that must not run twice at once, and when
    /// false return [`JobError::snooze`] with no wait, which counts no attempt.
    pub fn is_current(&self) -> bool {
        self.freshness.is_current()
    }

    /// Deserializes the payload. Its error, through `?` in a handler, fails the job at
    /// once (see [`JobError`]'s `From`).
    pub fn payload<'a, T: serde::Deserialize<'a>>(&'a self) -> crate::Result<T> {
        self.envelope.payload_as()
    }

    /// Whether [`progress`](Self::progress) and [`set_result`](Self::set_result) are
    /// recorded: the worker has a status store.
    pub fn keeps_status(&self) -> bool {
        self.report.writer.is_some()
    }

    /// Reports progress, 0–100 with a short note, to the job's status (shown by
    /// `switchyard serve` and streamed to its followers). Written in the background;
    /// without a status store it does nothing.
    pub fn progress(&self, percent: u8, note: impl Into<String>) {
        if let Some(writer) = &self.report.writer {
            writer.send(StatusUpdate::progress(
                &self.envelope,
                self.attempt,
                percent,
                Some(note.into()),
            ));
        }
    }

    /// Adds a line to the job's log, kept with the job (the last
    /// [`MAX_LOG_BYTES`](crate::job_log::MAX_LOG_BYTES) of each attempt) and shown by
    /// `switchyard job ID` and the dashboard; written in the background within a second.
    /// Without a store that keeps logs it does nothing (see [`crate::job_log`]).
    pub fn log(&self, line: impl AsRef<str>) {
        if let Some(log) = &self.log {
            log.push(line.as_ref());
        }
    }

    /// Stores `value` as this job's checkpoint, a small JSON cursor (at most
    /// [`MAX_CHECKPOINT_BYTES`](crate::checkpoint::MAX_CHECKPOINT_BYTES)): a later
    /// delivery of the job (after a crash, a deploy, a retry or a replay) reads it with
    /// [`checkpoint_as`](Self::checkpoint_as) and resumes. Written before this returns,
    /// and fenced: once another worker has the job it is refused with
    /// [`Error::LeaseLost`](crate::Error::LeaseLost), and the handler should stop.
    /// [`Error::NotSupported`](crate::Error::NotSupported) where the worker keeps no
    /// checkpoints (see [`crate::checkpoint`]).
    pub async fn checkpoint<T: serde::Serialize + ?Sized>(&self, value: &T) -> crate::Result<()> {
        let json = serde_json::to_string(value).map_err(|e| {
            crate::Error::InvalidInput(format!("the job's checkpoint is not JSON: {e}"))
        })?;
        self.checkpoint_store()?.save(&json).await
    }

    /// [`checkpoint`](Self::checkpoint) of JSON text (an exec command's), checked to be
    /// JSON.
    pub async fn save_checkpoint_json(&self, json: &str) -> crate::Result<()> {
        let store = self.checkpoint_store()?;
        serde_json::from_str::<serde::de::IgnoredAny>(json)
            .map_err(|e| crate::Error::InvalidInput(format!("a checkpoint must be JSON: {e}")))?;
        store.save(json).await
    }

    /// The job's last checkpoint, if an earlier run stored one; read from the store at
    /// each call.
    pub async fn checkpoint_as<T: serde::de::DeserializeOwned>(&self) -> crate::Result<Option<T>> {
        let Some(json) = self.checkpoint_store()?.load().await? else {
            return Ok(None);
        };
        serde_json::from_str(&json).map(Some).map_err(|e| {
            crate::Error::InvalidInput(format!(
                "the job's checkpoint does not read as the type asked for: {e}"
            ))
        })
    }

    /// The job's last checkpoint as JSON text, if it has one.
    pub async fn checkpoint_json(&self) -> crate::Result<Option<String>> {
        self.checkpoint_store()?.load().await
    }

    fn checkpoint_store(&self) -> crate::Result<&crate::checkpoint::JobCheckpoint> {
        self.checkpoint.as_ref().ok_or_else(|| {
            crate::Error::NotSupported(
                "checkpoints are kept in a SQL store beside the jobs: give the worker a status \
                 store (Worker::for_jobs, with_status; for RabbitMQ, DATABASE_URL as its \
                 control store); not during a migration through the router"
                    .to_owned(),
            )
        })
    }

    /// Sets the job's result: recorded with its `completed` status once the message is
    /// acknowledged, and returned to a [`publish_and_wait`](crate::status::Jobs::publish_and_wait)
    /// caller. A later call replaces it.
    pub fn set_result<T: serde::Serialize + ?Sized>(&self, result: &T) -> crate::Result<()> {
        let value = serde_json::to_value(result).map_err(|e| {
            crate::Error::InvalidInput(format!("the job's result is not JSON: {e}"))
        })?;
        if let Ok(mut slot) = self.report.result.lock() {
            *slot = Some(value);
        }
        Ok(())
    }
}

/// How a job failed, and what the worker should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobError {
    /// Retry later: after `after` when given, else after the policy's backoff. Once the
    /// attempts run out the message is dead-lettered with reason `max_attempts`.
    Retry {
        /// Recorded as the message's `last_error`.
        message: String,
        /// The delay the handler asks for.
        after: Option<Duration>,
    },
    /// Dead-letter now with reason `failed`: retrying cannot help.
    Fail {
        /// Recorded as the message's `last_error`.
        message: String,
    },
    /// Come back after `after` without counting an attempt: the job is not failing, it
    /// has to wait (an API answered 429, a resource is not ready yet).
    Snooze {
        /// Recorded in the job's status.
        message: String,
        /// How long to wait.
        after: Duration,
        /// Whether a rate limit said to wait (counted apart in the metrics).
        rate_limited: bool,
    },
}

impl JobError {
    /// Retry with the policy's backoff.
    pub fn retry(message: impl Into<String>) -> Self {
        JobError::Retry {
            message: message.into(),
            after: None,
        }
    }

    /// Retry after `after`.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        JobError::Retry {
            message: message.into(),
            after: Some(after),
        }
    }

    /// Dead-letter now.
    pub fn fail(message: impl Into<String>) -> Self {
        JobError::Fail {
            message: message.into(),
        }
    }

    /// Come back after `after` (at least 1 s), without counting an attempt. Snoozes
    /// are not limited: give a job that may wait for ever an expiry.
    pub fn snooze(after: Duration) -> Self {
        JobError::Snooze {
            message: format!("snoozed for {}", humantime::format_duration(after)),
            after,
            rate_limited: false,
        }
    }

    /// A rate limit said to wait `retry_after` (an HTTP 429's `Retry-After`): come back
    /// then, without counting an attempt.
    pub fn rate_limited(retry_after: Duration) -> Self {
        JobError::Snooze {
            message: format!(
                "rate limited: retry after {}",
                humantime::format_duration(retry_after)
            ),
            after: retry_after,
            rate_limited: true,
        }
    }

    /// The error message.
    pub fn message(&self) -> &str {
        match self {
            JobError::Retry { message, .. }
            | JobError::Fail { message }
            | JobError::Snooze { message, .. } => message,
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// Any error converts into a retry, so handlers can use `?`; except a payload that does
/// not decode ([`Error::Decode`](crate::Error::Decode) from [`JobContext::payload`], or
/// a `serde_json` data or syntax error), which no retry can mend: that fails the job at
/// once. A handler that expects a decoding error to pass (a producer deployed behind
/// its consumers, say) says so: `.map_err(|e| JobError::retry(e.to_string()))?`.
impl<E: std::error::Error + 'static> From<E> for JobError {
    fn from(err: E) -> Self {
        if is_decoding(&err) {
            JobError::fail(err.to_string())
        } else {
            JobError::retry(err.to_string())
        }
    }
}

fn is_decoding(err: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = err.downcast_ref::<crate::Error>() {
        return matches!(e, crate::Error::Decode(_));
    }
    if let Some(e) = err.downcast_ref::<serde_json::Error>() {
        return matches!(
            e.classify(),
            serde_json::error::Category::Data | serde_json::error::Category::Syntax
        );
    }
    false
}

/// What a handler returns.
pub type JobResult = Result<(), JobError>;

/// Handles the messages of one kind.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery.
    ///
    /// # Behavior
    /// `Ok` acks the message. [`JobError::Retry`] releases it for a later attempt,
    /// [`JobError::Fail`] dead-letters it. A panic counts as a retryable failure and never
    /// takes the worker down. The handler may run more than once for one message
    /// (at-least-once delivery), so it should be idempotent.
    async fn handle(&self, ctx: JobContext) -> JobResult;
}

type BoxedFuture = Pin<Box<dyn Future<Output = JobResult> + Send>>;

/// A handler made from an async closure; see [`handler_fn`].
pub struct FnHandler<F>(F);

impl<F> fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnHandler")
    }
}

/// Wraps an async closure `|ctx| async move { … }` as a [`Handler`].
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<impl Fn(JobContext) -> BoxedFuture + Send + Sync>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = JobResult> + Send + 'static,
{
    FnHandler(move |ctx| Box::pin(f(ctx)) as BoxedFuture)
}

#[async_trait]
impl<F> Handler for FnHandler<F>
where
    F: Fn(JobContext) -> BoxedFuture + Send + Sync + 'static,
{
    async fn handle(&self, ctx: JobContext) -> JobResult {
        (self.0)(ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_a_handler(payload: serde_json::Value) -> JobResult {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Invoice {
            customer: u64,
        }
        let env = Envelope::builder("q", "invoice")
            .payload(&payload)
            .build()
            .map_err(|e| JobError::retry(e.to_string()))?;
        let _invoice: Invoice = env.payload_as()?;
        Ok(())
    }

    #[test]
    fn a_payload_that_does_not_decode_fails_at_once() {
        assert_eq!(
            decode_in_a_handler(serde_json::json!({ "customer": 42 })),
            Ok(())
        );
        let err = decode_in_a_handler(serde_json::json!({ "customer": "x" }))
            .expect_err("a string is no customer number");
        assert!(matches!(err, JobError::Fail { .. }), "{err:?}");
        assert!(
            err.message().contains("does not match the expected type"),
            "{err:?}"
        );
        let direct: Result<u64, serde_json::Error> = serde_json::from_str("\"x\"");
        let err = JobError::from(direct.expect_err("not a number"));
        assert!(matches!(err, JobError::Fail { .. }), "{err:?}");
    }

    #[test]
    fn other_errors_retry() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(matches!(JobError::from(io), JobError::Retry { .. }));
        let backend = crate::Error::backend("test", true, "down");
        assert!(matches!(JobError::from(backend), JobError::Retry { .. }));
    }
}
