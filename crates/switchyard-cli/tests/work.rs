//! `switchyard work --exec` end to end: the command contract, failures, timeouts,
//! signals, and workers killed in the middle of a drain.

mod support;

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{text, Sandbox};

fn signal(child: &Child, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let _ = kill(pid, sig);
}

/// Lines of a log written by the handlers, counted.
fn counts(path: &std::path::Path) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        for line in text.lines().filter(|l| !l.is_empty()) {
            *seen.entry(line.to_owned()).or_default() += 1;
        }
    }
    seen
}

#[test]
fn exec_gets_the_envelope_on_stdin_and_the_message_in_its_environment() {
    let sb = Sandbox::new();
    let out = sb.run(&[
        "publish",
        "--queue",
        "exec",
        "--kind",
        "greet",
        "--payload",
        "{\"name\": \"Ada\"}",
        "--trace-id",
        "t-42",
        "--header",
        "tenant=acme",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    let cmd = "cat > \"got-$SWITCHYARD_MESSAGE_ID.json\"; env | grep '^SWITCHYARD_' | sort > \"got-$SWITCHYARD_MESSAGE_ID.env\"";
    let out = sb.run(&[
        "work", "--queue", "exec", "--exec", cmd, "--drain", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["succeeded"], 1);

    let body =
        std::fs::read_to_string(sb.path(&format!("got-{id}.json"))).expect("stdin was saved");
    let env: serde_json::Value = serde_json::from_str(&body).expect("the envelope is JSON");
    assert_eq!(env["id"], id.as_str());
    assert_eq!(env["v"], 1);
    assert_eq!(env["kind"], "greet");
    assert_eq!(env["payload"]["name"], "Ada");
    assert_eq!(env["trace_id"], "t-42");
    assert_eq!(env["headers"]["tenant"], "acme");
    let vars = std::fs::read_to_string(sb.path(&format!("got-{id}.env"))).expect("env was saved");
    for expected in [
        format!("SWITCHYARD_MESSAGE_ID={id}"),
        "SWITCHYARD_KIND=greet".to_owned(),
        "SWITCHYARD_ATTEMPT=1".to_owned(),
    ] {
        assert!(
            vars.lines().any(|l| l == expected),
            "{expected} missing from:\n{vars}"
        );
    }
    assert_eq!(sb.stats("exec")["ready"], 0);
}

#[test]
fn a_failing_command_is_retried_then_dead_lettered_with_the_end_of_its_stderr() {
    let sb = Sandbox::new();
    sb.publish_lines("fail", "charge", "{}\n");
    // 10,000 bytes of stderr: the end is kept, where the error usually is.
    let cmd = "echo \"attempt $SWITCHYARD_ATTEMPT\" >> attempts.log; \
               head -c 10000 /dev/zero | tr '\\0' x >&2; echo ' card declined' >&2; exit 7";
    let out = sb.run(&[
        "work",
        "--queue",
        "fail",
        "--exec",
        cmd,
        "--drain",
        "--max-attempts",
        "3",
        "--backoff-base",
        "50ms",
        "--backoff-max",
        "100ms",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let attempts = std::fs::read_to_string(sb.path("attempts.log")).expect("the command ran");
    assert_eq!(attempts, "attempt 1\nattempt 2\nattempt 3\n");
    let dead = sb.dead("fail");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["reason"], "max_attempts");
    assert_eq!(dead[0]["attempts"], 3);
    let error = dead[0]["last_error"].as_str().expect("the last error");
    assert!(
        error.starts_with("command exit status 7: ..."),
        "{:.80}",
        error
    );
    assert!(error.ends_with("xxx card declined"), "{error:.80}");
    assert!(
        error.len() < 4_200,
        "stderr was not truncated: {} bytes",
        error.len()
    );
}

#[test]
fn a_command_past_its_timeout_is_killed_with_its_children() {
    let sb = Sandbox::new();
    sb.publish_lines("slow", "hang", "{}\n");
    let cmd = "sleep 30 & echo $! > child.pid; wait";
    let started = Instant::now();
    let out = sb.run(&[
        "work",
        "--queue",
        "slow",
        "--exec",
        cmd,
        "--drain",
        "--timeout",
        "500ms",
        "--max-attempts",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the timeout did not stop the command"
    );
    let dead = sb.dead("slow");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out")),
        "{dead:?}"
    );
    let pid: i32 = std::fs::read_to_string(sb.path("child.pid"))
        .expect("the child's pid")
        .trim()
        .parse()
        .expect("a pid");
    let deadline = Instant::now() + Duration::from_secs(5);
    while kill(Pid::from_raw(pid), None).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the command's child {pid} outlived the timeout"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_lets_quick_jobs_finish_and_releases_the_rest_at_once() {
    let sb = Sandbox::new();
    sb.publish_lines("term", "quick", "{}\n");
    sb.publish_lines("term", "stuck", "{}\n");
    let cmd = "touch \"started-$SWITCHYARD_KIND\"; \
               if [ \"$SWITCHYARD_KIND\" = quick ]; then sleep 1; echo done > quick.done; else sleep 60; fi";
    let mut worker = start_and_wait_for(
        &sb,
        &[
            "work",
            "--queue",
            "term",
            "--exec",
            cmd,
            "--concurrency",
            "2",
            "--grace",
            "2s",
            "--json",
        ],
        &["started-quick", "started-stuck"],
    );
    let stopping = Instant::now();
    signal(&worker, Signal::SIGTERM);
    let out = worker_output(&mut worker, Duration::from_secs(20));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    assert!(
        sb.path("quick.done").exists(),
        "the quick job was not allowed to finish"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["succeeded"], 1, "{report}");
    assert_eq!(report["released_on_shutdown"], 1, "{report}");
    // The stuck job is due again now, not after its 90 s lease.
    let stats = sb.stats("term");
    assert_eq!(
        (stats["ready"].as_u64(), stats["reserved"].as_u64()),
        (Some(1), Some(0)),
        "{stats}"
    );
}

/// Starts the binary with `args` and waits until the handlers have created `files`.
fn start_and_wait_for(sb: &Sandbox, args: &[&str], files: &[&str]) -> Child {
    let worker = sb
        .cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !files.iter().all(|f| sb.path(f).exists()) {
        assert!(Instant::now() < deadline, "the jobs did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    worker
}

fn worker_output(child: &mut Child, within: Duration) -> std::process::Output {
    let deadline = Instant::now() + within;
    while child.try_wait().expect("poll the worker").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the worker did not stop within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = std::process::Output {
        status: child.wait().expect("the worker's status"),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut out.stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut out.stderr);
    }
    out
}

/// Three workers at concurrency 4 drain 3,000 messages with the default attempts (3)
/// while one of them, chosen at random, is killed with SIGKILL every 0.7 s, 12 times, and
/// replaced. Every message is handled, none is dead-lettered (a crash charges only what
/// had started, and a message charged before runs alone), and the duplicates stay within
/// what the killed workers held started: their running handlers plus their unflushed
/// acks.
#[test]
fn workers_killed_mid_drain_lose_nothing() {
    workers_killed_mid_drain_lose_nothing_on(&Sandbox::new(), "crash");
}

/// The same on PostgreSQL.
#[cfg(feature = "postgres")]
#[test]
fn workers_killed_mid_drain_lose_nothing_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        workers_killed_mid_drain_lose_nothing_on(&sb, "crash");
    }
}

/// The same on MariaDB.
#[cfg(feature = "mysql")]
#[test]
fn workers_killed_mid_drain_lose_nothing_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        workers_killed_mid_drain_lose_nothing_on(&sb, "crash");
    }
}

/// The same on RabbitMQ quorum queues, with the SQLite control store beside the broker
/// keeping start marks.
#[cfg(feature = "amqp")]
#[test]
fn workers_killed_mid_drain_lose_nothing_on_rabbitmq_quorum_queues() {
    if let Some(sb) = Sandbox::rabbitmq() {
        let queue = format!("crash-q-{:08x}", fastrand::u32(..));
        workers_killed_mid_drain_lose_nothing_on(&sb, &queue);
        support::delete_broker_queue(&queue);
    }
}

/// The same on RabbitMQ classic queues.
#[cfg(feature = "amqp")]
#[test]
fn workers_killed_mid_drain_lose_nothing_on_rabbitmq_classic_queues() {
    if let Some(mut sb) = Sandbox::rabbitmq() {
        sb.set_env("AMQP_QUEUE_TYPE", "classic");
        let queue = format!("crash-c-{:08x}", fastrand::u32(..));
        workers_killed_mid_drain_lose_nothing_on(&sb, &queue);
        support::delete_broker_queue(&queue);
    }
}

fn workers_killed_mid_drain_lose_nothing_on(sb: &Sandbox, queue: &str) {
    const MESSAGES: usize = 3_000;
    const WORKERS: usize = 3;
    const CONCURRENCY: usize = 4;
    const KILLS: usize = 12;
    // What one kill can make run twice: the handlers running, and those finished whose
    // ack had not committed (a few ack round trips' worth at most).
    const PER_KILL: usize = 4 * CONCURRENCY;
    let lines: String = (0..MESSAGES).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let ids = sb.publish_lines(queue, "job", &lines);
    assert_eq!(ids.len(), MESSAGES);
    let start_worker = || {
        sb.cmd(&[
            "work",
            "--queue",
            queue,
            "--exec",
            // Slow enough that the drain outlasts the kills.
            "sleep 0.02; echo \"$SWITCHYARD_MESSAGE_ID\" >> handled.log",
            "--concurrency",
            &CONCURRENCY.to_string(),
            "--visibility-timeout",
            "2s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
    };
    let mut workers: Vec<Child> = (0..WORKERS).map(|_| start_worker()).collect();
    let log = sb.path("handled.log");
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut handled_at_kills = Vec::new();
    for _ in 0..KILLS {
        std::thread::sleep(Duration::from_millis(700));
        let victim = fastrand::usize(..WORKERS);
        let _ = workers[victim].kill(); // SIGKILL
        let _ = workers[victim].wait();
        handled_at_kills.push(counts(&log).len());
        workers[victim] = start_worker();
    }
    // Let the survivors finish: every message handled and the queue empty. Handled is
    // not enough: a message run just before a kill is handled but still in the queue
    // until its lease runs out and a survivor runs (and acks) it again.
    loop {
        let handled = counts(&log).len();
        if handled == MESSAGES && queue_is_empty(&sb.stats(queue)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{handled} of {MESSAGES} handled; dead: {:?}; stats: {}",
            sb.dead(queue).len(),
            sb.stats(queue)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for w in &mut workers {
        signal(w, Signal::SIGTERM);
    }
    for w in &mut workers {
        let status = w.wait().expect("a worker's status");
        assert!(status.success(), "a worker failed at shutdown: {status}");
    }
    let seen = counts(&log);
    let missing = ids.iter().filter(|id| !seen.contains_key(*id)).count();
    assert_eq!(missing, 0, "messages never handled");
    let dead = sb.dead(queue);
    assert!(
        dead.is_empty(),
        "{} messages were dead-lettered",
        dead.len()
    );
    let stats = sb.stats(queue);
    for count in ["ready", "delayed", "reserved"] {
        assert_eq!(stats[count].as_u64(), Some(0), "{count} left: {stats}");
    }
    assert!(
        handled_at_kills.first().is_some_and(|&n| n < MESSAGES),
        "the drain ended before the first kill: {handled_at_kills:?}"
    );
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    let bound = KILLS * PER_KILL;
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates after {KILLS} kills (bound {bound})"
    );
    eprintln!(
        "{KILLS} kills, {duplicates} duplicates (bound {bound}); handled at each kill: {handled_at_kills:?}"
    );
}

fn queue_is_empty(stats: &serde_json::Value) -> bool {
    ["ready", "delayed", "reserved"]
        .iter()
        .all(|count| stats[count].as_u64() == Some(0))
}

/// A message whose handler kills its own worker every time ends in the dead-letter store
/// after max_attempts reclaims, and the rest of the queue is processed.
#[test]
fn a_poison_message_that_kills_its_worker_ends_in_the_dead_letter_store() {
    poison_message_ends_dead_on(&Sandbox::new());
}

/// The same on PostgreSQL.
#[cfg(feature = "postgres")]
#[test]
fn a_poison_message_that_kills_its_worker_ends_in_the_dead_letter_store_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        poison_message_ends_dead_on(&sb);
    }
}

/// The same on MariaDB.
#[cfg(feature = "mysql")]
#[test]
fn a_poison_message_that_kills_its_worker_ends_in_the_dead_letter_store_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        poison_message_ends_dead_on(&sb);
    }
}

fn poison_message_ends_dead_on(sb: &Sandbox) {
    let good = sb.publish_lines("poison", "fine", &"{}\n".repeat(20));
    let poison = sb.publish_lines("poison", "poison", "{}\n");
    // The poison's shell outlives the worker it kills: it exits rather than log itself
    // handled once its sleep ends, which a slow run would otherwise read.
    let cmd = "if [ \"$SWITCHYARD_KIND\" = poison ]; then kill -9 $PPID; sleep 5; exit 1; fi; \
               echo \"$SWITCHYARD_MESSAGE_ID\" >> handled.log";
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(
            runs <= 10,
            "the poison message was not contained after {runs} worker runs"
        );
        let out = sb.run(&[
            "work",
            "--queue",
            "poison",
            "--exec",
            cmd,
            "--drain",
            "--concurrency",
            "1",
            "--max-attempts",
            "3",
            "--visibility-timeout",
            "1s",
        ]);
        if out.status.success() {
            break;
        }
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "the worker failed other than by the poison: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        runs, 4,
        "three deliveries killed the worker, the fourth run drained the queue"
    );
    let dead = sb.dead("poison");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["id"], poison[0].as_str());
    assert_eq!(dead[0]["reason"], "max_attempts");
    let seen = counts(&sb.path("handled.log"));
    assert!(
        good.iter().all(|id| seen.contains_key(id)),
        "the rest of the queue was not processed"
    );
    assert!(!seen.contains_key(&poison[0]));
    let stats = sb.stats("poison");
    assert_eq!(
        (stats["ready"].as_u64(), stats["reserved"].as_u64()),
        (Some(0), Some(0)),
        "{stats}"
    );
}

/// With the default attempts, a poison message amid 120 healthy ones at concurrency 8,
/// its worker dying on every start and started again each time, is dead after exactly
/// three starts, and no healthy job is dead or charged more than once: a message charged
/// before runs alone, after every finished job's ack has committed.
#[test]
fn a_poison_message_amid_healthy_ones_takes_no_bystander_with_it() {
    poison_amid_healthy_on(&Sandbox::new(), "amid");
}

/// The same on PostgreSQL.
#[cfg(feature = "postgres")]
#[test]
fn a_poison_message_amid_healthy_ones_takes_no_bystander_with_it_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        poison_amid_healthy_on(&sb, "amid");
    }
}

/// The same on MariaDB.
#[cfg(feature = "mysql")]
#[test]
fn a_poison_message_amid_healthy_ones_takes_no_bystander_with_it_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        poison_amid_healthy_on(&sb, "amid");
    }
}

/// The same on RabbitMQ (quorum queues), with the SQLite control store keeping start
/// marks.
#[cfg(feature = "amqp")]
#[test]
fn a_poison_message_amid_healthy_ones_takes_no_bystander_with_it_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        let queue = format!("amid-{:08x}", fastrand::u32(..));
        poison_amid_healthy_on(&sb, &queue);
        support::delete_broker_queue(&queue);
    }
}

fn poison_amid_healthy_on(sb: &Sandbox, queue: &str) {
    let before = sb.publish_lines(queue, "fine", &"{}\n".repeat(20));
    let poison = sb.publish_lines(queue, "poison", "{}\n");
    let after = sb.publish_lines(queue, "fine", &"{}\n".repeat(100));
    // Each run logs its message and attempt; the poison kills its worker, and its shell,
    // which outlives the worker, exits without logging itself handled.
    let cmd = "echo \"$SWITCHYARD_MESSAGE_ID $SWITCHYARD_ATTEMPT\" >> starts.log; \
               if [ \"$SWITCHYARD_KIND\" = poison ]; then kill -9 $PPID; sleep 5; exit 1; fi; \
               sleep 0.01; echo \"$SWITCHYARD_MESSAGE_ID\" >> handled.log";
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs <= 10, "not contained after {runs} runs");
        let out = sb.run(&[
            "work",
            "--queue",
            queue,
            "--exec",
            cmd,
            "--drain",
            "--concurrency",
            "8",
            "--visibility-timeout",
            "1s",
        ]);
        if out.status.success() {
            break;
        }
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "the worker failed other than by the poison: {}",
            text(&out.stderr)
        );
    }
    let dead = sb.dead(queue);
    let dead_ids: Vec<&str> = dead.iter().filter_map(|d| d["id"].as_str()).collect();
    assert_eq!(
        dead_ids,
        [poison[0].as_str()],
        "bystanders were dead-lettered: {dead:?}"
    );
    assert_eq!(dead[0]["reason"], "max_attempts", "{dead:?}");
    let starts = std::fs::read_to_string(sb.path("starts.log")).unwrap_or_default();
    let mut highest: HashMap<&str, u32> = HashMap::new();
    for line in starts.lines() {
        let mut parts = line.split(' ');
        let (Some(id), Some(attempt)) = (parts.next(), parts.next()) else {
            continue;
        };
        let attempt: u32 = attempt.parse().expect("an attempt number");
        let top = highest.entry(id).or_default();
        *top = (*top).max(attempt);
    }
    let poison_starts = starts.lines().filter(|l| l.starts_with(&poison[0])).count();
    assert_eq!(
        poison_starts, 3,
        "the poison was started {poison_starts} times"
    );
    let charged_twice: Vec<_> = before
        .iter()
        .chain(&after)
        .filter(|id| highest.get(id.as_str()).is_some_and(|&a| a > 2))
        .collect();
    assert!(
        charged_twice.is_empty(),
        "healthy jobs charged more than once: {charged_twice:?}"
    );
    let seen = counts(&sb.path("handled.log"));
    let missing = before
        .iter()
        .chain(&after)
        .filter(|id| !seen.contains_key(*id))
        .count();
    assert_eq!(missing, 0, "healthy messages were not processed");
    eprintln!("contained in {runs} worker runs");
}

#[test]
fn a_second_signal_cuts_the_grace_period_short() {
    let sb = Sandbox::new();
    sb.publish_lines("twice", "long", "{}\n");
    let mut worker = start_and_wait_for(
        &sb,
        &[
            "work",
            "--queue",
            "twice",
            "--exec",
            "touch started; sleep 60",
            "--grace",
            "60s",
        ],
        &["started"],
    );
    let stopping = Instant::now();
    signal(&worker, Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    signal(&worker, Signal::SIGINT);
    let out = worker_output(&mut worker, Duration::from_secs(20));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "took {:?}",
        stopping.elapsed()
    );
    let stats = sb.stats("twice");
    assert_eq!(
        stats["ready"].as_u64(),
        Some(1),
        "the job was not released: {stats}"
    );
}

#[test]
fn a_command_that_leaves_a_background_process_finishes_when_it_exits() {
    let sb = Sandbox::new();
    sb.publish_lines("bg", "spawn", "{}\n");
    let started = Instant::now();
    let out = sb.run(&[
        "work",
        "--queue",
        "bg",
        "--exec",
        "sleep 30 & echo spawned",
        "--drain",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "waited for the background process"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["succeeded"], 1, "{report}");
}

/// Two workers, fast jobs with one slow job among them, leases shorter than the slow job:
/// a message marked started behind the slow job may lapse and move to the other worker,
/// but it is never run twice.
#[test]
fn messages_waiting_behind_a_slow_job_are_never_run_twice() {
    let sb = Sandbox::new();
    let mut lines = "{\"slow\":false}\n".repeat(40);
    lines.push_str("{\"slow\":true}\n");
    lines.push_str(&"{\"slow\":false}\n".repeat(40));
    let ids = sb.publish_lines("mixed", "job", &lines);
    let cmd = "if grep -q '\"slow\":true' ; then sleep 3; fi; echo \"$SWITCHYARD_MESSAGE_ID\" >> handled.log";
    let workers: Vec<Child> = (0..2)
        .map(|_| {
            sb.cmd(&[
                "work",
                "--queue",
                "mixed",
                "--exec",
                cmd,
                "--drain",
                "--concurrency",
                "1",
                "--visibility-timeout",
                "1s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a worker")
        })
        .collect();
    for mut w in workers {
        let out = worker_output(&mut w, Duration::from_secs(120));
        assert!(out.status.success(), "a worker failed");
    }
    let seen = counts(&sb.path("handled.log"));
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "run twice: {twice:?}");
    assert_eq!(seen.len(), ids.len(), "not every message ran");
    assert!(sb.dead("mixed").is_empty());
}

/// On PostgreSQL, which refuses NUL in text, a command whose stderr holds a NUL and
/// bytes that are not UTF-8 still has each failure stored: every retry waits its backoff,
/// not a whole lease, and the dead letter carries the real error, made readable.
#[cfg(feature = "postgres")]
#[test]
fn a_failure_with_a_nul_in_its_stderr_is_stored_and_retried_after_its_backoff_on_postgres() {
    let Some(sb) = Sandbox::postgres() else {
        return;
    };
    sb.publish_lines("nul", "charge", "{}\n");
    let cmd = "echo \"attempt $SWITCHYARD_ATTEMPT\" >> attempts.log; \
               printf 'bad\\000byte \\377: card declined\\n' >&2; exit 1";
    let started = Instant::now();
    let out = sb.run(&[
        "work",
        "--queue",
        "nul",
        "--exec",
        cmd,
        "--drain",
        "--max-attempts",
        "3",
        "--backoff-base",
        "50ms",
        "--backoff-max",
        "100ms",
        "--visibility-timeout",
        "30s",
    ]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        took < Duration::from_secs(10),
        "a retry waited for the 30 s lease: {took:?}"
    );
    let attempts = std::fs::read_to_string(sb.path("attempts.log")).expect("the command ran");
    assert_eq!(attempts, "attempt 1\nattempt 2\nattempt 3\n");
    let dead = sb.dead("nul");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["reason"], "max_attempts");
    assert_eq!(dead[0]["attempts"], 3);
    assert_eq!(
        dead[0]["last_error"],
        "command exit status 1: bad\u{fffd}byte \u{fffd}: card declined"
    );
}

/// A command that cannot run stops the worker before it takes a message, instead of
/// dead-lettering every message with exit status 127.
#[test]
fn a_command_that_cannot_run_is_refused_at_start() {
    let sb = Sandbox::new();
    sb.publish_lines("q", "job", "{}\n");
    std::fs::write(sb.path("plain.sh"), "echo hi\n").expect("write a script");
    for (exec, named) in [
        ("./missing.sh", "./missing.sh cannot be read"),
        ("./plain.sh --x", "./plain.sh is not executable"),
        ("no-such-program-anywhere", "not a command on PATH"),
    ] {
        let out = sb.run(&["work", "--queue", "q", "--exec", exec, "--drain"]);
        support::assert_one_line_error(&out, &["--exec", named]);
    }
    assert_eq!(sb.ready("q"), 1, "the message was left alone");
    assert!(sb.dead("q").is_empty());
}

/// A script's stderr is in the worker's debug log with its message id, on success too.
#[test]
fn a_scripts_stderr_is_logged_at_debug_whatever_its_exit() {
    let mut sb = Sandbox::new();
    let ids = sb.publish_lines("q", "job", "{}\n");
    sb.set_env("RUST_LOG", "switchyard=debug");
    let out = sb.run(&[
        "work",
        "--queue",
        "q",
        "--exec",
        "echo 'a warning worth reading' >&2",
        "--drain",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = text(&out.stderr);
    let line = log
        .lines()
        .find(|l| l.contains("a warning worth reading"))
        .unwrap_or_else(|| panic!("stderr not logged: {log}"));
    assert!(line.contains(&ids[0]), "no message id: {line}");
}

/// `switchyard job ID` shows a job: its state, payload, result, worker, times, and each
/// failed attempt with its error; a dead letter without a status record too.
#[test]
fn job_shows_state_payload_result_and_each_failed_attempt() {
    let sb = Sandbox::new();
    let id = sb
        .publish_lines("q", "render", "{\"pages\": 12}\n")
        .remove(0);
    let out = sb.run(&[
        "work",
        "--queue",
        "q",
        "--exec",
        "if [ \"$SWITCHYARD_ATTEMPT\" -lt 3 ]; then echo \"boom $SWITCHYARD_ATTEMPT\" >&2; exit 1; fi; echo '{\"ok\": true}'",
        "--drain",
        "--backoff-base",
        "10ms",
        "--backoff-max",
        "20ms",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = sb.run(&["job", &id, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("job JSON");
    let s = &view["status"];
    assert_eq!(s["state"], "completed", "{view}");
    assert_eq!(s["attempts"], 3);
    assert_eq!(s["payload"], serde_json::json!({"pages": 12}));
    assert_eq!(s["result"], serde_json::json!({"ok": true}));
    assert!(
        s["worker"].as_str().is_some_and(|w| w.contains(':')),
        "{view}"
    );
    assert!(view["duration_ms"].is_i64(), "{view}");
    let errors: Vec<&str> = view["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["error"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(errors.len(), 2, "{view}");
    assert!(
        errors[0].contains("boom 1") && errors[1].contains("boom 2"),
        "{errors:?}"
    );

    let out = sb.run(&["job", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    for needle in [
        "completed",
        "\"pages\": 12",
        "boom 1",
        "boom 2",
        "done:",
        "#2 retrying",
    ] {
        assert!(page.contains(needle), "{needle:?} not in:\n{page}");
    }

    // Not a job here; not a job id at all.
    let unknown = uuid::Uuid::now_v7().to_string();
    let out = sb.run(&["job", &unknown]);
    support::assert_one_line_error(&out, &[&unknown, "no status record"]);
    let out = sb.run(&["job", "nope"]);
    support::assert_one_line_error(&out, &["ID", "nope", "UUID"]);

    // Without status, a dead letter is still found.
    let mut sb = Sandbox::new();
    sb.set_env("QUEUE_STATUS", "off");
    let id = sb.publish_lines("q", "k", "{\"n\": 1}\n").remove(0);
    let out = sb.run(&[
        "work",
        "--queue",
        "q",
        "--exec",
        "exit 3",
        "--drain",
        "--max-attempts",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sb.run(&["job", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(
        page.contains("dead letter") && page.contains("\"n\": 1"),
        "{page}"
    );
}
