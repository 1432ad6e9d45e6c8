//! Unique keys end to end: `publish --unique-key` reports the job that holds a key, bad
//! rules are refused in one line, and a debounced key runs once per burst of events,
//! no later than its max_wait (measured with a running worker).

mod support;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{assert_one_line_error, text, Sandbox};

fn publish(sb: &Sandbox, queue: &str, flags: &[&str]) -> (String, String) {
    let mut args = vec![
        "publish",
        "--queue",
        queue,
        "--kind",
        "sync",
        "--payload",
        "{}",
    ];
    args.extend_from_slice(flags);
    let out = sb.run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (text(&out.stdout).trim().to_owned(), text(&out.stderr))
}

#[test]
fn a_second_publish_of_a_held_key_prints_the_holder_and_bad_rules_are_refused() {
    let sb = Sandbox::new();
    let (first, _) = publish(&sb, "accounts", &["--unique-key", "account-42"]);
    let (second, note) = publish(&sb, "accounts", &["--unique-key", "account-42"]);
    assert_eq!(
        second, first,
        "the duplicate prints the job that holds the key"
    );
    assert!(note.contains("held by job"), "{note}");
    let out = sb.run(&[
        "publish",
        "--queue",
        "accounts",
        "--kind",
        "sync",
        "--payload",
        "{}",
        "--unique-key",
        "account-42",
        "--json",
    ]);
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(line["duplicate_of"], first.as_str());
    assert_eq!(line["replaced"], false);
    assert_eq!(sb.ready("accounts"), 1, "one job for the key");

    for (flags, needles) in [
        (
            vec!["--unique-key", "k", "--on-conflict", "bogus"],
            vec!["--on-conflict", "\"bogus\"", "replace:MAX_WAIT"],
        ),
        (
            vec!["--unique-key", "k", "--unique-scope", "done"],
            vec!["--unique-scope", "done:PERIOD"],
        ),
        (
            vec!["--unique-key", " k", "--on-conflict", "throttle:5m"],
            vec!["--unique-key", "invalid unique key"],
        ),
        (
            vec!["--unique-key", "k", "--on-conflict", "replace:0s"],
            vec!["--unique-key", "max_wait"],
        ),
    ] {
        let mut args = vec![
            "publish",
            "--queue",
            "accounts",
            "--kind",
            "k",
            "--payload",
            "{}",
        ];
        args.extend(flags);
        assert_one_line_error(&sb.run(&args), &needles);
    }
    assert_eq!(sb.ready("accounts"), 1, "a refused publish stored nothing");
}

/// Runs a worker that appends "id nanoseconds" for each job it runs.
fn worker(sb: &Sandbox, queue: &str) -> Child {
    sb.cmd(&[
        "work",
        "--queue",
        queue,
        "--exec",
        "echo \"$SWITCHYARD_MESSAGE_ID $(date +%s%N)\" >> runs",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start a worker")
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos()
}

/// The runs the worker recorded: (job id, when, in ns since the epoch).
fn runs(sb: &Sandbox) -> Vec<(String, u128)> {
    std::fs::read_to_string(sb.path("runs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (id, ns) = l.split_once(' ')?;
            Some((id.to_owned(), ns.parse().ok()?))
        })
        .collect()
}

fn debounced_bursts(sb: &Sandbox) {
    let mut w = worker(sb, "debounce");
    // Two short bursts (6 events, 150 ms apart, each delaying the job 1.5 s): one run
    // per burst, 1.5 s after its last event. The delay is ten times the gap because each
    // event is a `switchyard publish` process, and on a loaded machine one took over
    // 500 ms to start: the job came due and ran between two events of a burst.
    let mut firsts = Vec::new();
    for burst in 0..2 {
        let mut ids = Vec::new();
        for _ in 0..6 {
            let mut flags = vec!["--unique-key", "short", "--delay", "1500ms"];
            flags.extend_from_slice(&["--unique-scope", "pending", "--on-conflict", "replace:10s"]);
            ids.push(publish(sb, "debounce", &flags).0);
            std::thread::sleep(Duration::from_millis(150));
        }
        assert!(ids.iter().all(|id| id == &ids[0]), "burst {burst}: {ids:?}");
        firsts.push(ids[0].clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while runs(sb).len() <= burst {
            assert!(Instant::now() < deadline, "burst {burst} never ran");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // A long burst (events every 150 ms for 4 s): max_wait brings the job due 2 s after
    // the first event, and later events make the next job.
    let started = now_ns();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let mut flags = vec!["--unique-key", "long", "--delay", "1500ms"];
        flags.extend_from_slice(&["--unique-scope", "pending", "--on-conflict", "replace:2s"]);
        publish(sb, "debounce", &flags);
        std::thread::sleep(Duration::from_millis(150));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs(sb).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the long burst ran {:?}",
            runs(sb)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let _ = w.kill();
    let _ = w.wait();
    let all = runs(sb);
    let short: Vec<_> = all.iter().filter(|(id, _)| firsts.contains(id)).collect();
    assert_eq!(short.len(), 2, "one run per short burst: {all:?}");
    let long: Vec<u128> = all
        .iter()
        .filter(|(id, _)| !firsts.contains(id))
        .map(|(_, ns)| *ns)
        .collect();
    let first_run = long.iter().min().copied().expect("a run of the long burst");
    let late = Duration::from_nanos(u64::try_from(first_run - started).unwrap_or(u64::MAX));
    eprintln!(
        "debounce: the long burst's first run came {late:?} after its first event (max_wait 2s); {} runs for a 4 s burst",
        long.len()
    );
    // The worker polls at most every second between jobs: due at 2 s, run by 3.5 s.
    assert!(
        late >= Duration::from_millis(1900) && late <= Duration::from_millis(3500),
        "the first run came {late:?} after the first event"
    );
    assert!(
        (2..=3).contains(&long.len()),
        "a 4 s burst with max_wait 2 s runs two or three times: {long:?}"
    );
}

#[test]
fn a_debounced_key_runs_once_per_burst_and_no_later_than_max_wait() {
    debounced_bursts(&Sandbox::new());
}

#[test]
fn a_debounced_key_runs_once_per_burst_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        debounced_bursts(&sb);
    }
}
