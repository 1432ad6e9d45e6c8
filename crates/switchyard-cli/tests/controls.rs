//! Pause, resume and cancel from the command line, on every backend: a paused queue is
//! not started by any worker until resumed; a cancelled exec job gets SIGTERM, then
//! SIGKILL after the grace period, and ends `cancelled`; a cancelled waiting job never
//! starts; bulk replay, purge and cancel by filter count first with `--dry-run`.

mod support;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::{text, Sandbox, Workers};

fn fresh_queue(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
}

fn worker(sb: &Sandbox, queue: &str, command: &str) -> Child {
    sb.cmd(&[
        "work",
        "--queue",
        queue,
        "--concurrency",
        "1",
        "--grace",
        "2s",
        "--exec",
        command,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start a worker")
}

fn lines(sb: &Sandbox, file: &str) -> Vec<String> {
    std::fs::read_to_string(sb.path(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn state(sb: &Sandbox, id: &str) -> String {
    let out = sb.run(&["job", id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["status"]["state"].as_str().unwrap_or_default().to_owned()
}

fn wait_for(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn a_paused_queue_waits_for_resume(sb: Sandbox) {
    let q = fresh_queue("paused");
    let out = sb.run(&["pause", &q]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    sb.publish_lines(&q, "job", &"{}\n".repeat(5));
    let cmd = "echo \"$SWITCHYARD_MESSAGE_ID $SWITCHYARD_ATTEMPT\" >> runs";
    let workers = Workers(vec![worker(&sb, &q, cmd), worker(&sb, &q, cmd)]);
    std::thread::sleep(Duration::from_millis(2000));
    assert!(lines(&sb, "runs").is_empty(), "a paused queue's job ran");
    let out = sb.run(&["stats", "--json", "--queue", &q]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert!(
        stats["paused"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["queue"] == q.as_str())),
        "stats does not show the pause: {stats}"
    );
    let out = sb.run(&["resume", &q]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(
        Duration::from_secs(15),
        "every job ran after the resume",
        || lines(&sb, "runs").len() == 5,
    );
    workers.stop();
    assert!(
        lines(&sb, "runs").iter().all(|l| l.ends_with(" 1")),
        "a pause counted an attempt"
    );
    forget(&sb, &q);
}

fn a_cancelled_exec_job_is_stopped_and_a_waiting_one_never_runs(sb: Sandbox) {
    let q = fresh_queue("cancel");
    let long = sb.publish_lines(&q, "long", "{}\n").remove(0);
    let waiting = sb.publish_lines(&q, "waiting", "{}\n").remove(0);
    // Records its start and a SIGTERM, and ignores the SIGTERM: only SIGKILL ends it.
    let cmd = "echo \"started $SWITCHYARD_MESSAGE_ID\" >> runs; \
               trap 'echo term >> runs; sleep 60' TERM; sleep 60 & wait; echo done >> runs";
    let w = Workers(vec![worker(&sb, &q, cmd)]);
    // Started, and recorded as running (a start's record waits up to 100 ms for its
    // ending), which `cancel` reports.
    wait_for(Duration::from_secs(20), "the long job started", || {
        lines(&sb, "runs").contains(&format!("started {long}")) && state(&sb, &long) == "running"
    });
    let out = sb.run(&["cancel", &waiting]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let asked = Instant::now();
    let out = sb.run(&["cancel", &long]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("running"),
        "{}",
        text(&out.stdout)
    );
    wait_for(
        Duration::from_secs(10),
        "the running job ended cancelled",
        || state(&sb, &long) == "cancelled",
    );
    let took = asked.elapsed();
    // The worker reads cancellations every quarter second; the command then has the
    // grace period (2 s) to stop after its SIGTERM.
    assert!(
        took < Duration::from_millis(3500),
        "ended cancelled {took:?} after the ask"
    );
    wait_for(
        Duration::from_secs(10),
        "the waiting job ended cancelled",
        || state(&sb, &waiting) == "cancelled",
    );
    w.stop();
    let runs = lines(&sb, "runs");
    assert!(
        runs.contains(&"term".to_owned()),
        "no SIGTERM reached the command: {runs:?}"
    );
    assert!(
        !runs.contains(&"done".to_owned()),
        "the command was not killed: {runs:?}"
    );
    assert!(
        !runs.contains(&format!("started {waiting}")),
        "the job cancelled while waiting ran: {runs:?}"
    );
    forget(&sb, &q);
}

/// Deletes a queue a test made on the test broker.
fn forget(sb: &Sandbox, queue: &str) {
    #[cfg(feature = "amqp")]
    if sb.rabbitmq {
        support::delete_broker_queue(queue);
    }
    let _ = (sb, queue);
}

#[test]
fn a_paused_queue_waits_for_resume_on_sqlite() {
    a_paused_queue_waits_for_resume(Sandbox::new());
}

#[test]
fn a_paused_queue_waits_for_resume_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        a_paused_queue_waits_for_resume(sb);
    }
}

#[test]
fn a_paused_queue_waits_for_resume_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        a_paused_queue_waits_for_resume(sb);
    }
}

#[test]
fn a_paused_queue_waits_for_resume_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        a_paused_queue_waits_for_resume(sb);
    }
}

#[test]
fn a_cancelled_exec_job_is_stopped_on_sqlite() {
    a_cancelled_exec_job_is_stopped_and_a_waiting_one_never_runs(Sandbox::new());
}

#[test]
fn a_cancelled_exec_job_is_stopped_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        a_cancelled_exec_job_is_stopped_and_a_waiting_one_never_runs(sb);
    }
}

#[test]
fn a_cancelled_exec_job_is_stopped_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        a_cancelled_exec_job_is_stopped_and_a_waiting_one_never_runs(sb);
    }
}

#[test]
fn a_cancelled_exec_job_is_stopped_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        a_cancelled_exec_job_is_stopped_and_a_waiting_one_never_runs(sb);
    }
}

fn json_of(sb: &Sandbox, args: &[&str]) -> serde_json::Value {
    let out = sb.run(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Dead letters replayed and purged by kind, and waiting jobs cancelled by filter, each
/// counted first with `--dry-run` (which changes nothing).
fn bulk_actions_by_filter_count_first(sb: Sandbox) {
    let q = fresh_queue("bulk");
    let a = sb.publish_lines(&q, "a", &"{}\n".repeat(3));
    sb.publish_lines(&q, "b", &"{}\n".repeat(2));
    let out = sb.run(&[
        "work",
        "--queue",
        &q,
        "--exec",
        "exit 1",
        "--max-attempts",
        "1",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sb.dead(&q).len(), 5);
    let dry = json_of(
        &sb,
        &[
            "dead",
            "replay",
            "--queue",
            &q,
            "--kind",
            "a",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(dry["would_replay"], 3, "{dry}");
    assert_eq!(sb.dead(&q).len(), 5, "a dry run replayed");
    let done = json_of(
        &sb,
        &["dead", "replay", "--queue", &q, "--kind", "a", "--json"],
    );
    assert_eq!(done["replayed"], 3, "{done}");
    let dry = json_of(
        &sb,
        &[
            "dead",
            "purge",
            "--queue",
            &q,
            "--kind",
            "b",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(dry["would_purge"], 2, "{dry}");
    let done = json_of(
        &sb,
        &["dead", "purge", "--queue", &q, "--kind", "b", "--json"],
    );
    assert_eq!(done["purged"], 2, "{done}");
    assert!(sb.dead(&q).is_empty());
    let dry = json_of(
        &sb,
        &[
            "cancel",
            "--queue",
            &q,
            "--kind",
            "a",
            "--state",
            "pending",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(dry["would_cancel"], 3, "{dry}");
    let done = json_of(&sb, &["cancel", "--queue", &q, "--kind", "a", "--json"]);
    assert_eq!(done["cancelled"], 3, "{done}");
    let out = sb.run(&[
        "work",
        "--queue",
        &q,
        "--exec",
        "echo run >> ran",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(lines(&sb, "ran").is_empty(), "a cancelled job ran");
    for id in &a {
        assert_eq!(state(&sb, id), "cancelled", "job {id}");
    }
    forget(&sb, &q);
}

#[test]
fn bulk_actions_by_filter_count_first_on_sqlite() {
    bulk_actions_by_filter_count_first(Sandbox::new());
}

#[test]
fn bulk_actions_by_filter_count_first_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        bulk_actions_by_filter_count_first(sb);
    }
}

#[test]
fn bulk_actions_by_filter_count_first_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        bulk_actions_by_filter_count_first(sb);
    }
}
