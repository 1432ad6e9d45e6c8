//! The shared conformance suite against the local RabbitMQ (`SWITCHYARD_TEST_AMQP_URL`),
//! with quorum queues (the default) and with classic queues (priorities).
//!
//! Every case runs here except those in [`NOT_APPLICABLE`], each with the reason AMQP
//! cannot keep that rule; a test checks that the two lists together name every case.
//! Cases use fresh queue names; a case's queues are deleted after it, and expire on
//! the broker after ten idle minutes should the test process die first.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use queue_core::conformance::{Harness, OpenOptions, Store, CASE_NAMES};
use queue_core::{QueueName, Result, Transport};
use support::url;
use transport_amqp::{AmqpOptions, AmqpTransport, QueueKind};

/// Cases that do not apply to AMQP, and why.
const NOT_APPLICABLE: &[(&str, &str)] = &[
    (
        "expired_lease_is_reclaimed_and_counts_an_attempt",
        "a delivery has no lease that runs out: it stays with its consumer until acked or \
         until the consumer's channel closes, and then it is redelivered with the attempt \
         counted (tests/amqp.rs: a_dead_consumers_messages_come_back_with_an_attempt_counted)",
    ),
    (
        "stale_token_is_fenced_with_lease_lost",
        "it makes a token stale by letting its lease run out, which deliveries do not; \
         tokens made stale by a closed channel are fenced (tests/amqp.rs)",
    ),
    (
        "ack_batch_reports_lost_leases_and_acks_the_rest",
        "it loses leases by letting them run out; a lease lost to a closed channel is \
         reported lost (tests/amqp.rs)",
    ),
    (
        "extending_a_lapsed_lease_before_a_reclaim_holds_it_again",
        "no lease lapses on AMQP",
    ),
    (
        "claims_start_only_fresh_messages_and_prefetches_none",
        "a consumer holds up to `prefetch` deliveries by design (basic.qos); they count as \
         ready until handed out, and go back to the queue when the channel closes",
    ),
    (
        "lost_lease_cancels_the_handler_at_once",
        "it loses the lease by letting it run out; a lease lost to a closed channel fails \
         the next heartbeat the same way",
    ),
    (
        "tables_are_isolated",
        "there are no tables: queues are separated by their names (and vhosts)",
    ),
    (
        "invalid_identifiers_are_rejected_before_any_sql_runs",
        "there are no table or schema identifiers; queue names are checked by QueueName \
         and the 255-byte AMQP limit (tests/amqp.rs)",
    ),
];

/// The transports a case opened, to delete their queues afterwards.
type Opened = Arc<Mutex<Vec<Arc<AmqpTransport>>>>;

struct AmqpHarness {
    kind: QueueKind,
    opened: Opened,
}

struct AmqpStore {
    kind: QueueKind,
    opened: Opened,
}

impl AmqpStore {
    fn options(&self, url: String) -> AmqpOptions {
        AmqpOptions::new(url)
            .with_queue_kind(self.kind)
            .with_queue_expires(Duration::from_secs(600))
            .with_reconnect_timeout(Duration::from_secs(2))
    }
}

#[async_trait]
impl Harness for AmqpHarness {
    async fn store(&self) -> Result<Box<dyn Store>> {
        Ok(Box::new(AmqpStore {
            kind: self.kind,
            opened: self.opened.clone(),
        }))
    }

    fn skip_reason(&self) -> Option<String> {
        support::skip_reason()
    }

    async fn teardown(&self) {
        let opened: Vec<_> = std::mem::take(&mut *self.opened.lock().expect("the list"));
        for t in opened {
            for q in t.queues() {
                if let Ok(q) = QueueName::new(q) {
                    let _ = t.delete_queue(&q).await;
                }
            }
            t.close().await;
        }
    }
}

#[async_trait]
impl Store for AmqpStore {
    async fn open_with_status(
        &self,
        _options: OpenOptions,
    ) -> Result<(
        Arc<dyn Transport>,
        Option<Arc<dyn queue_core::status::StatusStore>>,
    )> {
        let t = Arc::new(AmqpTransport::connect(self.options(url())).await?);
        self.opened.lock().expect("the list").push(t.clone());
        Ok((t, None))
    }

    async fn open_unreachable(&self, _options: OpenOptions) -> Result<Arc<dyn Transport>> {
        let url = "amqp://guest:guest@127.0.0.1:1/%2f".to_owned();
        Ok(Arc::new(AmqpTransport::connect(self.options(url)).await?))
    }

    /// "Table" is meaningless here: the body goes to `queue` as it is.
    async fn insert_raw(&self, _table: &str, queue: &str, id: &str, body: &str) -> Result<()> {
        let t = Arc::new(AmqpTransport::connect(self.options(url())).await?);
        self.opened.lock().expect("the list").push(t.clone());
        let q = QueueName::new(queue)?;
        t.publish_raw(&q, id, body).await
    }
}

fn harness(kind: QueueKind) -> Arc<dyn Harness> {
    Arc::new(AmqpHarness {
        kind,
        opened: Opened::default(),
    })
}

/// The cases run below, as the macro invocations name them.
fn cases_run() -> Vec<&'static str> {
    let source = include_str!("conformance.rs");
    let start = source.find("\nmod quorum {").expect("the quorum module");
    let end = source[start..].find("\n}\n").expect("its end") + start;
    queue_core::conformance::case_names_in(&source[start..end])
}

/// Every case either runs or is listed as not applicable, with a reason.
#[test]
fn every_case_runs_or_says_why_not() {
    let run = cases_run();
    for name in CASE_NAMES {
        let skipped = NOT_APPLICABLE.iter().any(|(n, _)| n == name);
        assert!(
            run.contains(name) != skipped,
            "{name}: it must either run or be listed as not applicable (runs: {}, listed: {skipped})",
            run.contains(name)
        );
    }
    for (name, why) in NOT_APPLICABLE {
        assert!(CASE_NAMES.contains(name), "{name} is not a case");
        assert!(why.len() > 20, "{name} needs a reason");
    }
}

mod quorum {
    queue_core::conformance_tests!(@cases super::harness(transport_amqp::QueueKind::Quorum);
        round_trip_preserves_payload_headers_and_trace_id,
        empty_reserve_returns_promptly,
        fifo_within_a_priority_and_higher_priority_first,
        delayed_message_is_invisible_until_due,
        expired_message_is_never_delivered,
        ack_removes_the_message,
        release_increments_attempts_and_delays,
        dead_letter_then_list_replay_and_purge,
        extend_keeps_a_long_job_leased,
        concurrent_workers_claim_each_message_exactly_once,
        queues_are_isolated,
        queues_stay_isolated_under_concurrent_churn,
        publishing_the_same_id_twice_stores_one_message,
        batch_publish_and_batch_reserve,
        one_mib_payload_round_trips,
        over_limit_payload_is_rejected_and_nothing_is_stored,
        malformed_row_is_quarantined_and_the_next_message_served,
        outside_text_with_nuls_and_any_length_is_stored,
        an_envelope_naming_another_queue_never_wedges_its_queue,
        stats_count_ready_delayed_reserved_and_dead
    );
    queue_core::conformance_tests!(@worker super::harness(transport_amqp::QueueKind::Quorum);
        worker_handles_every_message_once_and_coalesces_acks,
        worker_retries_with_backoff_then_dead_letters,
        worker_honours_max_attempts_retry_after_and_fail,
        worker_dead_letters_or_releases_unknown_kinds,
        worker_never_handles_expired_messages,
        worker_checks_expiry_where_the_backend_does_not,
        heartbeat_keeps_a_long_job_from_being_reclaimed,
        handler_timeout_cancels_and_counts_a_failure,
        handler_panic_is_isolated_and_recorded,
        shutdown_finishes_quick_jobs_and_releases_the_rest,
        shutdown_is_prompt_at_any_moment,
        idle_worker_wakes_on_publish,
        a_suspect_runs_alone_after_every_finished_ack_has_committed
    );
}

/// Classic queues: priorities, and the attempt counted by republishing a redelivery.
mod classic {
    queue_core::conformance_tests!(@cases super::harness(transport_amqp::QueueKind::Classic);
        round_trip_preserves_payload_headers_and_trace_id,
        fifo_within_a_priority_and_higher_priority_first,
        release_increments_attempts_and_delays,
        dead_letter_then_list_replay_and_purge,
        batch_publish_and_batch_reserve,
        malformed_row_is_quarantined_and_the_next_message_served,
        an_envelope_naming_another_queue_never_wedges_its_queue
    );
    queue_core::conformance_tests!(@worker super::harness(transport_amqp::QueueKind::Classic);
        worker_handles_every_message_once_and_coalesces_acks,
        worker_retries_with_backoff_then_dead_letters
    );
}
