//! Ordering keys end to end: 1,000 keys × 20 messages drained by four `work --exec`
//! processes at concurrency 8, 5% of the handlers failing once and a worker killed twice
//! mid-run. For every key, handlers start in publish order and never overlap.

mod support;

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::Sandbox;

const KEYS: usize = 1_000;
const EACH: usize = 20;
const WORKERS: usize = 4;

/// The handler: a line when it starts and one when it ends, with the key, the message's
/// place in its key (its kind, `s7`, or `f7` for one that fails its first attempt) and the
/// shell's pid, which tells runs apart (a start also says the worker's pid and the
/// attempt, for a failure's message). Appends of one short line are atomic, so the
/// log's order is the order things happened in.
const HANDLER: &str = "echo \"s $SWITCHYARD_ORDERING_KEY $SWITCHYARD_KIND $$ $PPID $SWITCHYARD_ATTEMPT\" >> runs.log; \
    case \"$SWITCHYARD_KIND.$SWITCHYARD_ATTEMPT\" in f*.1) \
      echo \"e $SWITCHYARD_ORDERING_KEY $SWITCHYARD_KIND $$ fail\" >> runs.log; exit 1;; esac; \
    echo \"e $SWITCHYARD_ORDERING_KEY $SWITCHYARD_KIND $$ ok\" >> runs.log";

#[test]
fn keys_stay_in_order_across_processes_failures_and_kills() {
    keys_stay_in_order_on(&Sandbox::new(), "ordered");
}

#[cfg(feature = "postgres")]
#[test]
fn keys_stay_in_order_across_processes_failures_and_kills_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        keys_stay_in_order_on(&sb, "ordered");
    }
}

#[cfg(feature = "mysql")]
#[test]
fn keys_stay_in_order_across_processes_failures_and_kills_on_mariadb() {
    if let Some(sb) = Sandbox::mysql() {
        keys_stay_in_order_on(&sb, "ordered");
    }
}

#[cfg(feature = "amqp")]
#[test]
fn keys_stay_in_order_across_processes_failures_and_kills_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        let queue = format!("ordered-{}", fastrand::u32(..));
        keys_stay_in_order_on(&sb, &queue);
        support::delete_broker_queue(&queue);
    }
}

/// The distinct messages whose handler succeeded, from the log.
fn distinct_successes(log: &std::path::Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let done: std::collections::HashSet<(&str, &str)> = text
        .lines()
        .filter(|l| l.ends_with(" ok"))
        .filter_map(|l| {
            let mut parts = l.split(' ').skip(1);
            Some((parts.next()?, parts.next()?))
        })
        .collect();
    done.len()
}

fn keys_stay_in_order_on(sb: &Sandbox, queue: &str) {
    assert!(sb.run(&["migrate"]).status.success());
    publish(sb, queue);
    let start_worker = || {
        sb.cmd(&[
            "work",
            "--queue",
            queue,
            "--exec",
            HANDLER,
            "--concurrency",
            "8",
            "--visibility-timeout",
            "2s",
            "--backoff-base",
            "50ms",
            "--backoff-max",
            "200ms",
            "--max-attempts",
            "5",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
    };
    let started = Instant::now();
    let mut workers: Vec<Child> = (0..WORKERS).map(|_| start_worker()).collect();
    let log = sb.path("runs.log");
    let total = KEYS * EACH;
    let succeeded = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with(" ok"))
            .count()
    };
    // Killed twice mid-run, at a third and at two thirds, and replaced.
    let mut kills = Vec::new();
    for share in [3, 3 * 2] {
        let deadline = Instant::now() + Duration::from_secs(240);
        while succeeded() * 9 < total * share {
            assert!(
                Instant::now() < deadline,
                "the drain stalled: {}",
                sb.stats(queue)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // A worker that is running handlers now (on RabbitMQ, where one consumer of a
        // partition works it at a time, a random one may be idle).
        let busy = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| l.starts_with("s "))
            .and_then(|l| l.split(' ').nth(4).and_then(|p| p.parse::<u32>().ok()));
        let victim = busy
            .and_then(|pid| workers.iter().position(|w| w.id() == pid))
            .unwrap_or_else(|| fastrand::usize(..WORKERS));
        eprintln!("killing worker {}", workers[victim].id());
        let _ = workers[victim].kill(); // SIGKILL
        let _ = workers[victim].wait();
        kills.push(succeeded());
        workers[victim] = start_worker();
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        // RabbitMQ counts only what no consumer holds, so the log says when all is done.
        let stats = sb.stats(queue);
        if ["ready", "delayed", "reserved"]
            .iter()
            .all(|c| stats[c].as_u64() == Some(0))
            && distinct_successes(&log) == total
        {
            break;
        }
        assert!(Instant::now() < deadline, "not drained: {stats}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = started.elapsed();
    for w in &mut workers {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(w.id()).expect("a pid")),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for w in &mut workers {
        let _ = w.wait();
    }
    assert!(sb.dead(queue).is_empty(), "messages were dead-lettered");
    let text = std::fs::read_to_string(&log).expect("the run log");
    let checked = check_order(&text);
    assert_eq!(
        checked.succeeded, total,
        "every message succeeded once at least"
    );
    eprintln!(
        "{total} messages over {KEYS} keys in {elapsed:.1?} ({:.0}/s) with {WORKERS} workers; \
         {} runs, {} failed on purpose, {} cut by the kills (at {kills:?} successes)",
        total as f64 / elapsed.as_secs_f64(),
        checked.runs,
        checked.failed,
        checked.cut
    );
    assert!(checked.failed > 0, "no handler failed on purpose");
}

/// 20 rounds of one message per key, each key's messages in order; every 20th message
/// (by a fixed spread over keys) fails its first attempt.
fn publish(sb: &Sandbox, queue: &str) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    rt.block_on(async {
        let t = switchyard::connect(&sb.config()).await.expect("the store");
        for n in 0..EACH {
            let batch = (0..KEYS)
                .map(|k| {
                    let kind = if (k * 7 + n * 13) % 20 == 0 { "f" } else { "s" };
                    switchyard::Envelope::builder(queue, format!("{kind}{n}"))
                        .ordering_key(format!("order-{k}"))
                        .build()
                        .expect("an envelope")
                })
                .collect();
            t.publish_batch(batch).await.expect("a publish");
        }
    });
}

/// The lines of `key` in the log, for a failure's message.
fn history(log: &str, key: &str) -> String {
    log.lines()
        .filter(|l| l.split(' ').nth(1) == Some(key))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One run of a handler: the message's place in its key, the shell's pid, and how it
/// ended (`ok`, `fail`; none while running, or when its worker was killed).
type Run<'a> = (usize, &'a str, Option<&'a str>);

#[derive(Debug, Default)]
struct Checked {
    runs: usize,
    succeeded: usize,
    failed: usize,
    cut: usize,
}

/// Checks the log: per key, runs start in publish order (a message's place never goes
/// back), and a run starts only after the key's previous run ended (a run cut by a kill
/// never ends; the lease it held had to run out first). Counts the distinct messages
/// that succeeded.
fn check_order(log: &str) -> Checked {
    // Per key: runs in the order they started.
    let mut keys: HashMap<&str, Vec<Run<'_>>> = HashMap::new();
    let mut succeeded = std::collections::HashSet::new();
    let mut checked = Checked::default();
    for line in log.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [what, key, kind, pid, ref rest @ ..] = parts[..] else {
            panic!("a torn log line: {line:?}");
        };
        let place: usize = kind[1..].parse().expect("a place");
        let runs = keys.entry(key).or_default();
        match what {
            "s" => {
                if let Some((prev, prev_pid, ended)) = runs.last() {
                    assert!(
                        *prev <= place,
                        "key {key}: message {place} started after message {prev}; the key's log:\n{}",
                        history(log, key)
                    );
                    if ended.is_none() {
                        // Only a run cut by a kill may stay open: it was another worker's.
                        eprintln!("key {key}: run {prev_pid} of message {prev} never ended (a killed worker)");
                        checked.cut += 1;
                    }
                }
                runs.push((place, pid, None));
                checked.runs += 1;
            }
            "e" => {
                let run = runs
                    .last_mut()
                    .unwrap_or_else(|| panic!("key {key}: an end without a start: {line}"));
                assert_eq!(
                    run.1, pid,
                    "key {key}: run {pid} ended after another run of the key started"
                );
                run.2 = rest.first().copied();
                match rest.first().copied() {
                    Some("ok") => {
                        succeeded.insert((key, place));
                    }
                    _ => checked.failed += 1,
                }
            }
            other => panic!("an unknown log line {other:?}"),
        }
    }
    checked.succeeded = succeeded.len();
    assert_eq!(keys.len(), KEYS, "every key ran");
    checked
}
