//! Limits across worker processes (`work --limit`), on every backend: a concurrency
//! limit of 2 per key holds with four workers of 16 handlers while one is killed and
//! another frozen past its lease, and no slot stays held afterwards; a rate of 50 a
//! second is kept within 10% over 20 s by four workers once past the burst they start
//! on, and the jobs it holds back run on their first attempt.
//!
//! They measure time across processes, so they run alone, after the parallel suite
//! (`scripts/test`; by hand: `cargo nextest run --run-ignored only -E 'binary(limits)'`).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{text, Sandbox, Workers};

fn fresh_queue(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
}

/// Starts a worker of 16 handlers running `command` per job under `limit`.
fn worker(sb: &Sandbox, queue: &str, limit: &str, command: &str) -> Child {
    sb.cmd(&[
        "work",
        "--queue",
        queue,
        "--concurrency",
        "16",
        "--limit",
        limit,
        "--exec",
        command,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start a worker")
}

fn signal(child: &Child, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let _ = kill(pid, sig);
}

/// The probe's lines: (start or end, key, job id, ns).
fn probe(sb: &Sandbox) -> Vec<(String, String, String, u128)> {
    std::fs::read_to_string(sb.path("probe"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.split(' ');
            Some((
                p.next()?.to_owned(),
                p.next()?.to_owned(),
                p.next()?.to_owned(),
                p.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The most runs of one key that overlapped, per key; every start must have its end.
fn most_at_once(lines: &[(String, String, String, u128)]) -> BTreeMap<String, i32> {
    let mut open: HashMap<&str, Vec<u128>> = HashMap::new();
    let mut events: BTreeMap<&str, Vec<(u128, i32)>> = BTreeMap::new();
    for (what, key, id, ns) in lines {
        match what.as_str() {
            "start" => open.entry(id).or_default().push(*ns),
            _ => {
                let start = open
                    .get_mut(id.as_str())
                    .and_then(Vec::pop)
                    .expect("an end has its start");
                let e = events.entry(key).or_default();
                e.push((start, 1));
                e.push((*ns, -1));
            }
        }
    }
    assert!(
        open.values().all(Vec::is_empty),
        "a run never ended: {open:?}"
    );
    events
        .into_iter()
        .map(|(key, mut e)| {
            // An end and a start at the same instant do not overlap.
            e.sort();
            let (mut now, mut most) = (0, 0);
            for (_, d) in e {
                now += d;
                most = most.max(now);
            }
            (key.to_owned(), most)
        })
        .collect()
}

fn concurrency_holds_through_a_kill_and_a_lapse(mut sb: Sandbox) {
    sb.set_env("QUEUE_VISIBILITY_TIMEOUT", "2s");
    let q = fresh_queue("limited");
    let lines: String = (0..24)
        .flat_map(|n| (0..4).map(move |k| format!("{{\"t\":\"k{k}\",\"n\":{n}}}\n")))
        .collect();
    let ids: HashSet<String> = sb.publish_lines(&q, "call", &lines).into_iter().collect();
    assert_eq!(ids.len(), 96);
    // A run whose worker was killed while handing it its message reads no key (the pipe
    // closed early): it is no run of the job, which runs again once its lease lapses.
    let probe_cmd =
        "cat > in.$$; t=$(sed -n 's/.*\"t\":\"\\([a-z0-9]*\\)\".*/\\1/p' in.$$); rm -f in.$$; \
                     [ -n \"$t\" ] || exit 1; echo \"start $t $SWITCHYARD_MESSAGE_ID $(date +%s%N)\" >> probe; sleep 0.3; \
                     echo \"end $t $SWITCHYARD_MESSAGE_ID $(date +%s%N)\" >> probe";
    let limit = "field:/t,concurrency=2";
    let workers = Workers((0..4).map(|_| worker(&sb, &q, limit, probe_cmd)).collect());
    std::thread::sleep(Duration::from_millis(1500));
    // One worker dies mid-run: its slots run out with its leases.
    signal(&workers[0], Signal::SIGKILL);
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    // Another freezes past its lease: others take its jobs and slots, and when it wakes
    // its settlements and frees name leases that are gone.
    signal(&workers[1], Signal::SIGSTOP);
    std::thread::sleep(Duration::from_millis(3500));
    signal(&workers[1], Signal::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done: HashSet<String> = probe(&sb)
            .into_iter()
            .filter(|(what, ..)| what == "end")
            .map(|(_, _, id, _)| id)
            .collect();
        if ids.is_subset(&done) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of 96 jobs ran within 120 s",
            done.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    workers.stop();
    let stopped_at = Instant::now();
    let most = most_at_once(&probe(&sb));
    assert_eq!(most.len(), 4, "{most:?}");
    for (key, n) in &most {
        assert!(*n <= 2, "key {key}: {n} ran at once under a limit of 2");
    }
    assert!(
        most.values().any(|n| *n == 2),
        "never two at once: {most:?}"
    );
    // Every slot was freed, or runs out with the lease that held it, such as the killed
    // worker's: a SQL lease here is 2 s; a RabbitMQ delivery has no lease that runs out,
    // and its slot counts 10 s past its last renewal.
    let hold = if sb.rabbitmq { 10 } else { 2 };
    let deadline = stopped_at.max(killed_at) + Duration::from_secs(hold + 5);
    let usage = loop {
        let out = sb.run(&["stats", "--limits", "--json", "--queue", &q]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let usage: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let held: u64 = usage["limits"]
            .as_array()
            .map(|keys| keys.iter().filter_map(|k| k["running"].as_u64()).sum())
            .unwrap_or(0);
        if held == 0 {
            break usage;
        }
        assert!(
            Instant::now() < deadline,
            "a slot stayed held past its lease: {usage}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let keys = usage["limits"].as_array().expect("a list of keys");
    assert_eq!(keys.len(), 4, "{usage}");
    for key in keys {
        assert_eq!(key["concurrency"], 2, "{key}");
    }
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

fn a_rate_is_kept_over_20_seconds(sb: Sandbox) {
    let q = fresh_queue("rated");
    // The window starts 5 s in and lasts 20 s: past the burst (5 starts at once) and the
    // first seconds, when every job is claimed once to be booked and the starts booked
    // meanwhile can come back late (docs/jobs.md says so, with what this test prints for
    // the first 20 s). On RabbitMQ one worker holds most of the burst in its prefetch,
    // and those seconds last about 10. Enough jobs for 3 s past the window: every job
    // has run when the test ends, and none is left in RabbitMQ's delay chain when its
    // queue is deleted.
    let skip: u128 = if sb.rabbitmq { 10 } else { 5 };
    let jobs = 50 * (usize::try_from(skip).unwrap_or(10) + 23);
    let lines = "{\"t\":\"api\"}\n".repeat(jobs);
    sb.publish_lines(&q, "call", &lines);
    let cmd = "echo \"$(date +%s%N) $SWITCHYARD_ATTEMPT\" >> starts";
    let limit = "field:/t,rate=50/s,burst=5";
    let workers = Workers((0..4).map(|_| worker(&sb, &q, limit, cmd)).collect());
    let starts = || -> Vec<(u128, String)> {
        std::fs::read_to_string(sb.path("starts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (ns, attempt) = l.split_once(' ')?;
                Some((ns.parse().ok()?, attempt.to_owned()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(first) = starts().iter().map(|(ns, _)| *ns).min() {
            break first;
        }
        assert!(Instant::now() < deadline, "no job started within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (from, to) = (
        first + skip * 1_000_000_000,
        first + (skip + 20) * 1_000_000_000,
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    while starts().iter().all(|(ns, _)| *ns < to) {
        assert!(Instant::now() < deadline, "the 20 s window never closed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while starts().len() < jobs {
        assert!(
            Instant::now() < deadline,
            "not every job ran within 60 s of the window"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    workers.stop();
    let all = starts();
    let n = all.iter().filter(|(ns, _)| (from..to).contains(ns)).count();
    let rate = n as f64 / 20.0;
    let early = all
        .iter()
        .filter(|(ns, _)| (first + 1_000_000_000..first + 21_000_000_000).contains(ns))
        .count() as f64
        / 20.0;
    eprintln!(
        "measured {rate:.1} starts/s under a limit of 50/s from {skip} s to {} s, {early:.1} from 1 s to 21 s after the burst",
        skip + 20
    );
    assert!(
        (45.0..=55.0).contains(&rate),
        "{rate:.1} starts/s over 20 s under a limit of 50/s"
    );
    assert!(
        all.iter().all(|(_, attempt)| attempt == "1"),
        "a wait for a token counted an attempt"
    );
    forget(&sb, &q);
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn concurrency_holds_through_a_kill_and_a_lapse_on_sqlite() {
    concurrency_holds_through_a_kill_and_a_lapse(Sandbox::new());
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn concurrency_holds_through_a_kill_and_a_lapse_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        concurrency_holds_through_a_kill_and_a_lapse(sb);
    }
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn concurrency_holds_through_a_kill_and_a_lapse_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        concurrency_holds_through_a_kill_and_a_lapse(sb);
    }
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn concurrency_holds_through_a_kill_and_a_lapse_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        concurrency_holds_through_a_kill_and_a_lapse(sb);
    }
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn a_rate_is_kept_over_20_seconds_on_sqlite() {
    a_rate_is_kept_over_20_seconds(Sandbox::new());
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn a_rate_is_kept_over_20_seconds_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        a_rate_is_kept_over_20_seconds(sb);
    }
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn a_rate_is_kept_over_20_seconds_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        a_rate_is_kept_over_20_seconds(sb);
    }
}

#[test]
#[ignore = "four worker processes measured by the clock: scripts/test runs these alone, after the parallel suite"]
fn a_rate_is_kept_over_20_seconds_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        a_rate_is_kept_over_20_seconds(sb);
    }
}
