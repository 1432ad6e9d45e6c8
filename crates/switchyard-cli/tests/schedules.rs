//! Schedules across worker processes, on every backend: a per-second schedule fired by
//! four workers for a minute, while they are killed and restarted, one is frozen for
//! 10 s and all are down for 6 s, makes exactly one job per slot: every slot with
//! `catch_up = "all"`, and with `latest` every slot but those of the outage, of which
//! it fires the newest. A schedules file applied twice changes nothing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{assert_one_line_error, text, Sandbox, Workers};

const S: i64 = 1_000_000;

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Records "kind slot id" for each job it runs (the slot from the envelope's headers).
fn worker(sb: &Sandbox, queue: &str) -> Child {
    sb.cmd(&[
        "work",
        "--queue",
        queue,
        "--exec",
        "cat > in.$$; s=$(sed -n 's/.*\"switchyard-slot\":\"\\([^\"]*\\)\".*/\\1/p' in.$$); \
         rm -f in.$$; echo \"$SWITCHYARD_KIND $s $SWITCHYARD_MESSAGE_ID\" >> runs",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start a worker")
}

fn signal(child: &Child, sig: Signal) {
    let _ = kill(
        Pid::from_raw(i32::try_from(child.id()).expect("a pid")),
        sig,
    );
}

fn restart(sb: &Sandbox, workers: &mut Workers, i: usize, queue: &str) {
    let _ = workers.0[i].kill();
    let _ = workers.0[i].wait();
    workers.0[i] = worker(sb, queue);
}

/// The jobs run per kind: slot (µs) → the distinct job ids that ran for it.
fn runs(sb: &Sandbox) -> BTreeMap<String, BTreeMap<i64, BTreeSet<String>>> {
    let mut out: BTreeMap<String, BTreeMap<i64, BTreeSet<String>>> = BTreeMap::new();
    for line in std::fs::read_to_string(sb.path("runs"))
        .unwrap_or_default()
        .lines()
    {
        let mut parts = line.split(' ');
        let (Some(kind), Some(slot), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(at) = chrono::DateTime::parse_from_rfc3339(slot) else {
            continue;
        };
        out.entry(kind.to_owned())
            .or_default()
            .entry(at.timestamp_micros())
            .or_default()
            .insert(id.to_owned());
    }
    out
}

/// The cursor of each schedule, by name.
fn cursors(sb: &Sandbox) -> BTreeMap<String, i64> {
    let out = sb.run(&["schedule", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    list["schedules"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            let at = s["fired_through"].as_str().expect("a cursor");
            let at = chrono::DateTime::parse_from_rfc3339(at).expect("RFC 3339");
            (
                s["name"].as_str().expect("a name").to_owned(),
                at.timestamp_micros(),
            )
        })
        .collect()
}

fn add(sb: &Sandbox, name: &str, queue: &str, kind: &str, catch_up: &[&str]) {
    let mut args = vec![
        "schedule", "add", name, "--every", "1s", "--queue", queue, "--kind", kind,
    ];
    args.extend_from_slice(catch_up);
    let out = sb.run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn every_slot_runs_once_through_kills_a_freeze_and_an_outage(mut sb: Sandbox) {
    sb.set_env("QUEUE_VISIBILITY_TIMEOUT", "3s");
    let q = format!("sched-{:08x}", fastrand::u32(..));
    let added = now_us();
    add(
        &sb,
        "every",
        &q,
        "all",
        &["--catch-up", "all", "--within", "10m"],
    );
    add(&sb, "newest", &q, "latest", &[]);
    let mut workers = Workers((0..4).map(|_| worker(&sb, &q)).collect());
    let pause = |secs: u64| std::thread::sleep(Duration::from_secs(secs));
    pause(10);
    signal(&workers[0], Signal::SIGKILL);
    pause(5);
    restart(&sb, &mut workers, 0, &q);
    pause(5);
    // Frozen for 10 s: when it wakes, its scheduler fires from a cursor long past.
    signal(&workers[1], Signal::SIGSTOP);
    pause(10);
    signal(&workers[1], Signal::SIGCONT);
    pause(5);
    signal(&workers[2], Signal::SIGKILL);
    signal(&workers[3], Signal::SIGKILL);
    pause(3);
    restart(&sb, &mut workers, 2, &q);
    restart(&sb, &mut workers, 3, &q);
    pause(7);
    // Every worker down for 6 s: no one fires.
    for w in workers.iter() {
        signal(w, Signal::SIGKILL);
    }
    let down_from = now_us();
    pause(6);
    let down_to = now_us();
    for i in 0..4 {
        restart(&sb, &mut workers, i, &q);
    }
    pause(9);
    for name in ["every", "newest"] {
        let out = sb.run(&["schedule", "pause", name]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let through = cursors(&sb);
    let last = through["every"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let all = loop {
        let all = runs(&sb);
        let every = all.get("all").cloned().unwrap_or_default();
        let complete = every.keys().next().is_some_and(|first| {
            (0..)
                .map(|k| first + k * S)
                .take_while(|s| *s <= last)
                .all(|s| every.contains_key(&s))
        });
        if complete && every.contains_key(&last) {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "the slots through {last} did not all run within 60 s: {} ran",
            every.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    // Late deliveries of the newest schedule's last jobs.
    std::thread::sleep(Duration::from_secs(2));
    let all = {
        let again = runs(&sb);
        if again.len() >= all.len() {
            again
        } else {
            all
        }
    };
    workers.stop();
    let every = &all["all"];
    let first = *every.keys().next().expect("a slot ran");
    assert!(
        first <= added + 2 * S,
        "the first slot came {} µs after the schedule was added",
        first - added
    );
    let expected: Vec<i64> = (0..)
        .map(|k| first + k * S)
        .take_while(|s| *s <= last)
        .collect();
    let missing: Vec<_> = expected.iter().filter(|s| !every.contains_key(s)).collect();
    assert!(missing.is_empty(), "slots that never ran: {missing:?}");
    for (slot, ids) in every.iter().chain(&all["latest"]) {
        assert_eq!(ids.len(), 1, "slot {slot} made {} jobs: {ids:?}", ids.len());
    }
    // `latest` skipped the outage's slots but its newest, and fired every other slot.
    let newest = &all["latest"];
    let outage: Vec<i64> = expected
        .iter()
        .copied()
        .filter(|s| *s > down_from + S && *s < down_to - S)
        .collect();
    let outage_fired = outage.iter().filter(|s| newest.contains_key(s)).count();
    assert!(
        outage.len() >= 3 && outage_fired <= 1,
        "latest fired {outage_fired} of the {} slots of the outage",
        outage.len()
    );
    eprintln!(
        "schedules: {} slots, each one job under `all`; `latest` fired {} ({} of the outage's {})",
        every.len(),
        newest.len(),
        outage_fired,
        outage.len()
    );
    if sb.rabbitmq {
        support::delete_broker_queue(&q);
    }
}

#[test]
fn every_slot_runs_once_through_kills_a_freeze_and_an_outage_on_sqlite() {
    every_slot_runs_once_through_kills_a_freeze_and_an_outage(Sandbox::new());
}

#[test]
fn every_slot_runs_once_through_kills_a_freeze_and_an_outage_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        every_slot_runs_once_through_kills_a_freeze_and_an_outage(sb);
    }
}

#[test]
fn every_slot_runs_once_through_kills_a_freeze_and_an_outage_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        every_slot_runs_once_through_kills_a_freeze_and_an_outage(sb);
    }
}

#[test]
fn every_slot_runs_once_through_kills_a_freeze_and_an_outage_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        every_slot_runs_once_through_kills_a_freeze_and_an_outage(sb);
    }
}

#[test]
fn a_schedules_file_applied_twice_changes_nothing_and_mistakes_are_named() {
    let sb = Sandbox::new();
    let file = sb.path("schedules.toml");
    std::fs::write(
        &file,
        r#"
[[schedule]]
name = "nightly-report"
cron = "0 3 * * *"
timezone = "Europe/Berlin"
queue = "reports"
kind = "nightly"
payload = { region = "eu" }
catch_up = "all"
max_runs = 10
within = "6h"

[[schedule]]
name = "heartbeat"
every = "30s"
queue = "ops"
kind = "ping"
"#,
    )
    .expect("write the file");
    let apply = |extra: &[&str]| {
        let mut args = vec!["schedule", "apply", "schedules.toml", "--json"];
        args.extend_from_slice(extra);
        let out = sb.run(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let first = apply(&[]);
    assert_eq!(first["applied"]["nightly-report"], "added");
    assert_eq!(first["applied"]["heartbeat"], "added");
    let before = cursors(&sb);
    let second = apply(&[]);
    assert_eq!(second["applied"]["nightly-report"], "unchanged");
    assert_eq!(second["applied"]["heartbeat"], "unchanged");
    assert_eq!(cursors(&sb), before, "applying again moved no cursor");
    // A file without the heartbeat, with --prune, removes it.
    let text_without = std::fs::read_to_string(&file)
        .expect("read")
        .split("[[schedule]]\nname = \"heartbeat\"")
        .next()
        .expect("a part")
        .to_owned();
    std::fs::write(&file, text_without).expect("write");
    let pruned = apply(&["--prune"]);
    assert_eq!(pruned["removed"], serde_json::json!(["heartbeat"]));
    assert_eq!(cursors(&sb).len(), 1);

    for (body, needles) in [
        ("[[schedule]]\nname = \"x\"\nqueue = \"q\"\nkind = \"k\"\n", vec!["exactly one of cron"]),
        (
            "[[schedule]]\nname = \"x\"\ncron = \"0 3 * * *\"\ntimezone = \"Mars/Base\"\nqueue = \"q\"\nkind = \"k\"\n",
            vec!["Mars/Base", "IANA"],
        ),
        ("[[schedule]]\nname = \"x\"\nevery = \"1m\"\nqueue = \"q\"\nkind = \"k\"\ncolour = \"red\"\n", vec!["colour"]),
        ("[[schedule]]\nname = \"bad name\"\nevery = \"1m\"\nqueue = \"q\"\nkind = \"k\"\n", vec!["bad name", "accepted"]),
    ] {
        std::fs::write(sb.path("bad.toml"), body).expect("write");
        assert_one_line_error(&sb.run(&["schedule", "apply", "bad.toml"]), &needles);
    }
    assert_eq!(cursors(&sb).len(), 1, "a refused file stored nothing");
}
