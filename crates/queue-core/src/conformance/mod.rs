//! The shared conformance suite: one `pub async fn` per rule of the contract, run by
//! every transport's tests through [`conformance_tests!`](crate::conformance_tests).
//!
//! Not semver-stable: it changes with the contract.
//!
//! A transport provides a [`Harness`] that makes fresh, isolated stores (a database
//! file, a schema, a vhost namespace); every case uses its own store and fresh queue
//! names, so cases run in parallel.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::status::StatusStore;
use crate::{Result, Transport};

mod bad_data_cases;
mod case_support;
pub mod cases;
mod lease_cases;
mod shutdown_cases;
pub mod status_cases;
mod status_support;
mod status_view_cases;
mod suspect_cases;
pub mod unreachable;
pub mod worker_cases;
mod worker_support;

/// How a case wants a transport opened.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Table (or the backend's equivalent) for the transport's store.
    pub table: String,
    /// Lease length.
    pub visibility_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            table: "switchyard_jobs".into(),
            visibility_timeout: Duration::from_secs(30),
        }
    }
}

/// Makes fresh, isolated stores for the cases.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A fresh store that no other case uses.
    async fn store(&self) -> Result<Box<dyn Store>>;

    /// Why the cases cannot run here (the backend's server is unreachable outside CI),
    /// or `None` to run them. A harness must never skip under `CI=true`.
    fn skip_reason(&self) -> Option<String> {
        None
    }

    /// Removes what the case left on the server, after it passed or failed (a broker's
    /// queues, say, which would otherwise pile up). Nothing by default.
    async fn teardown(&self) {}
}

/// One isolated store (a database file, a schema, …).
#[async_trait]
pub trait Store: Send + Sync {
    /// Opens a transport over this store (runs migrations as needed).
    async fn open(&self, options: OpenOptions) -> Result<Arc<dyn Transport>> {
        Ok(self.open_with_status(options).await?.0)
    }

    /// Opens a transport and the job status store beside it, where the backend keeps
    /// one.
    async fn open_with_status(
        &self,
        options: OpenOptions,
    ) -> Result<(Arc<dyn Transport>, Option<Arc<dyn StatusStore>>)>;

    /// Opens a transport with `options` against a database that cannot be reached.
    /// Validation errors must win over connection errors: this proves they are raised
    /// before any SQL runs.
    async fn open_unreachable(&self, options: OpenOptions) -> Result<Arc<dyn Transport>>;

    /// Writes a message body directly into `table`, bypassing the transport's encoder
    /// (to plant a malformed row).
    async fn insert_raw(&self, table: &str, queue: &str, id: &str, body: &str) -> Result<()>;
}

/// Runs one case on its own runtime, panicking with the error when it fails.
pub fn run<F, Fut>(harness: Arc<dyn Harness>, case: F)
where
    F: FnOnce(Arc<dyn Harness>) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    if let Some(reason) = harness.skip_reason() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance case");
    let outcome = rt.block_on(async {
        // A task of its own, so that the teardown runs after a failed assertion too.
        let case = tokio::spawn(tokio::time::timeout(
            Duration::from_secs(300),
            case(harness.clone()),
        ));
        let outcome = case.await;
        let _ = tokio::time::timeout(Duration::from_secs(60), harness.teardown()).await;
        outcome
    });
    match outcome {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => panic!("conformance case failed: {err}"),
        Ok(Err(_)) => panic!("conformance case did not finish within 300 s"),
        Err(join) => match join.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(err) => panic!("conformance case was cancelled: {err}"),
        },
    }
}

/// Expands to one `#[test]` per conformance case, each running against a harness made
/// by `$harness` (an expression evaluated per test that yields `Arc<dyn Harness>`).
/// Every backend runs every case: a case that needs a capability the transport lacks
/// ends at once, saying which ([`Capabilities`](crate::Capabilities) is the one list of
/// what a backend cannot do).
///
/// ```ignore
/// mod skip_locked {
///     queue_core::conformance_tests!(crate::harness(ClaimStrategy::SkipLocked));
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            round_trip_preserves_payload_headers_and_trace_id,
            empty_reserve_returns_promptly,
            fifo_within_a_priority_and_higher_priority_first,
            delayed_message_is_invisible_until_due,
            expired_message_is_never_delivered,
            ack_removes_the_message,
            release_increments_attempts_and_delays,
            dead_letter_then_list_replay_and_purge,
            expired_lease_is_reclaimed_and_counts_an_attempt,
            claims_start_only_fresh_messages_and_prefetches_none,
            stale_token_is_fenced_with_lease_lost,
            extend_keeps_a_long_job_leased,
            extending_a_lapsed_lease_before_a_reclaim_holds_it_again,
            concurrent_workers_claim_each_message_exactly_once,
            queues_are_isolated,
            queues_stay_isolated_under_concurrent_churn,
            tables_are_isolated,
            publishing_the_same_id_twice_stores_one_message,
            batch_publish_and_batch_reserve,
            ack_batch_reports_lost_leases_and_acks_the_rest,
            one_mib_payload_round_trips,
            over_limit_payload_is_rejected_and_nothing_is_stored,
            malformed_row_is_quarantined_and_the_next_message_served,
            outside_text_with_nuls_and_any_length_is_stored,
            an_envelope_naming_another_queue_never_wedges_its_queue,
            invalid_identifiers_are_rejected_before_any_sql_runs,
            stats_count_ready_delayed_reserved_and_dead
        );
        $crate::conformance_tests!(@worker $harness;
            worker_handles_every_message_once_and_coalesces_acks,
            worker_retries_with_backoff_then_dead_letters,
            worker_honours_max_attempts_retry_after_and_fail,
            worker_dead_letters_or_releases_unknown_kinds,
            worker_never_handles_expired_messages,
            worker_checks_expiry_where_the_backend_does_not,
            heartbeat_keeps_a_long_job_from_being_reclaimed,
            lost_lease_cancels_the_handler_at_once,
            handler_timeout_cancels_and_counts_a_failure,
            handler_panic_is_isolated_and_recorded,
            shutdown_finishes_quick_jobs_and_releases_the_rest,
            shutdown_is_prompt_at_any_moment,
            idle_worker_wakes_on_publish,
            a_suspect_runs_alone_after_every_finished_ack_has_committed
        );
    };
    (@worker $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::worker_cases::$case);
            }
        )*
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::cases::$case);
            }
        )*
    };
}

/// Whether the server of `url` (`scheme://user@host:port/…`) accepts TCP connections:
/// `None` when it does, otherwise a line saying that `backend`'s tests are skipped.
///
/// # Panics
/// Under `CI=true` an unreachable server is a failure, never a skip.
pub fn skip_unless_reachable(backend: &str, url: &str, default_port: u16) -> Option<String> {
    use std::net::{TcpStream, ToSocketAddrs};

    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    let reachable = host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());
    if reachable {
        return None;
    }
    let why = format!(
        "{backend} tests skipped: no server at {host_port} (run scripts/test, which installs and starts one)"
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}; under CI=true an unreachable backend is a failure"
    );
    Some(why)
}
