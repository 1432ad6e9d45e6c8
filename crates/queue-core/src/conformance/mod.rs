//! The shared conformance suite: one `pub async fn` per rule of the contract, run by
//! every transport's tests through [`conformance_tests!`](crate::conformance_tests).
//!
//! Not semver-stable: it changes with the contract.
//!
//! A transport provides a [`Harness`] that makes fresh, isolated stores (a database
//! file, a schema, a vhost namespace); every case uses its own store and fresh queue
//! names, so cases run in parallel.

mod bad_data_cases;
mod broker_key_cases;
mod case_support;
pub mod cases;
pub mod checkpoint_cases;
pub mod control_cases;
mod faulty;
mod harness;
mod holder_cases;
mod label_cases;
mod lease_cases;
pub mod limit_cases;
pub mod log_cases;
mod ordering_cases;
mod runner;
pub mod schedule_cases;
mod shutdown_cases;
pub mod status_cases;
mod status_support;
mod status_view_cases;
mod suspect_cases;
mod unique_cases;
pub mod unreachable;
mod upkeep_cases;
pub mod worker_cases;
mod worker_support;

pub use harness::{Harness, OpenOptions, Store};
pub use runner::{run, skip_unless_reachable};

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
    // The cases of unique keys alone: for a transport that keeps them only with a store
    // beside it (RabbitMQ with its control store), run in a harness of their own.
    (unique_keys: $harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            a_held_unique_key_rejects_the_second_publish,
            unique_scopes_decide_how_long_a_key_is_held,
            done_periods_and_throttles_hold_a_key_past_its_job,
            a_done_hold_is_set_only_under_the_jobs_lease,
            debounce_moves_a_waiting_job_no_later_than_max_wait,
            racing_publishers_leave_one_job_per_key,
            a_batch_takes_its_keys_as_one_by_one_publishes_would,
            racing_batches_leave_one_job_per_key,
            invalid_unique_keys_are_refused,
            a_brokers_keys_are_taken_held_and_freed,
            an_unconfirmed_brokers_key_is_held_for_its_window
        );
    };
    // The cases of limits, pauses, cancellations and schedules: for a transport that keeps them
    // only with a store beside it (RabbitMQ with its control store), run in a harness of
    // their own.
    (limits: $harness:expr) => {
        $crate::conformance_tests!(@limits $harness;
            a_concurrency_limit_holds_across_workers,
            a_stale_lease_frees_no_slot,
            a_rate_limit_spaces_starts_without_counting_attempts,
            a_saturated_key_parks_its_jobs_until_a_slot_frees,
            a_woken_job_goes_before_its_keys_later_jobs,
            a_batch_books_each_job_its_own_start
        );
        $crate::conformance_tests!(@controls $harness;
            pausing_stops_starts_until_resumed,
            cancelled_jobs_never_run_or_are_stopped,
            a_mark_left_by_an_ended_run_cancels_no_later_run
        );
        $crate::conformance_tests!(@schedules $harness;
            racing_schedulers_fire_each_slot_once,
            missed_slots_follow_the_catch_up_policy,
            schedules_are_applied_paused_triggered_and_removed,
            a_pruning_schedule_prunes_at_its_slot_and_publishes_nothing,
            a_dropped_worker_run_fires_no_more_slots
        );
        $crate::conformance_tests!(@checkpoints $harness;
            a_checkpoint_is_fenced_by_the_run_that_holds_the_job,
            a_redelivered_job_resumes_from_its_checkpoint
        );
        $crate::conformance_tests!(@logs $harness;
            each_attempt_keeps_its_last_log_lines
        );
    };
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
            a_snooze_comes_back_later_without_counting_an_attempt,
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
            stats_count_ready_delayed_reserved_and_dead,
            claims_select_by_label,
            labels_survive_retry_dead_letter_and_replay,
            invalid_labels_are_refused,
            claims_record_their_holder_and_lease_end,
            one_message_per_key_in_publish_order,
            replays_of_a_key_come_back_in_order,
            delays_and_lapsed_leases_hold_the_key,
            an_expired_head_hands_its_key_on,
            a_skipped_message_in_a_batch_holds_no_key,
            concurrent_claimers_keep_every_key_in_order
        );
        $crate::conformance_tests!(unique_keys: $harness);
        $crate::conformance_tests!(limits: $harness);
        $crate::conformance_tests!(@worker $harness;
            worker_handles_every_message_once_and_coalesces_acks,
            worker_retries_with_backoff_then_dead_letters,
            worker_honours_max_attempts_retry_after_and_fail,
            worker_snoozes_without_counting_an_attempt,
            worker_dead_letters_or_releases_unknown_kinds,
            worker_never_handles_expired_messages,
            a_workers_upkeep_dead_letters_what_expires,
            claims_leave_the_upkeep_to_a_worker_calling_for_it,
            worker_checks_expiry_where_the_backend_does_not,
            heartbeat_keeps_a_long_job_from_being_reclaimed,
            lost_lease_cancels_the_handler_at_once,
            handler_timeout_cancels_and_counts_a_failure,
            handler_panic_is_isolated_and_recorded,
            shutdown_finishes_quick_jobs_and_releases_the_rest,
            shutdown_is_prompt_at_any_moment,
            a_dropped_run_stops_its_handlers,
            idle_worker_wakes_on_publish,
            a_suspect_runs_alone_after_every_finished_ack_has_committed,
            worker_with_labels_handles_only_those
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
    (@controls $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::control_cases::$case);
            }
        )*
    };
    (@checkpoints $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::checkpoint_cases::$case);
            }
        )*
    };
    (@logs $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::log_cases::$case);
            }
        )*
    };
    (@schedules $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::schedule_cases::$case);
            }
        )*
    };
    (@limits $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run($harness, $crate::conformance::limit_cases::$case);
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
