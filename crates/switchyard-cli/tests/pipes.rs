//! Commands whose stdout and stderr are closed (a pipe whose reader left, as in
//! `switchyard work … 2>&1 | head -3`, or a terminal that went away) neither hang nor
//! panic, and still do their work.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{text, Sandbox};

/// The write end of a pipe whose read end is already closed: every write fails with
/// EPIPE.
fn closed_pipe() -> Stdio {
    // nix's pipe, not std's: std::io::pipe is newer than this crate's MSRV.
    let (read, write) = nix::unistd::pipe().expect("a pipe");
    drop(read);
    Stdio::from(write)
}

/// `cmd` with stdout and stderr closed from the start.
fn spawn_closed(mut cmd: Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .spawn()
        .expect("spawn switchyard")
}

/// Waits at most `limit` for the child: a hang fails the test (and kills the child).
fn wait_at_most(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung for {limit:?} with its output closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_clean_exit(status: ExitStatus, what: &str) {
    assert_ne!(status.code(), Some(101), "{what} panicked");
    assert!(status.success(), "{what} failed: {status}");
}

/// Debug logging makes every command write to stderr all the time.
fn chatty(sb: &mut Sandbox) {
    sb.set_env("RUST_LOG", "debug");
}

#[test]
fn work_drain_with_its_output_closed_handles_everything_and_exits() {
    let mut sb = Sandbox::new();
    sb.publish_lines("q", "job", &"{}\n".repeat(50));
    chatty(&mut sb);
    let mut child =
        spawn_closed(sb.cmd(&["work", "--queue", "q", "--exec", "echo done", "--drain"]));
    let status = wait_at_most(&mut child, Duration::from_secs(60), "work --drain");
    assert_clean_exit(status, "work --drain");
    sb.unset_env("RUST_LOG");
    assert_eq!(sb.ready("q"), 0, "every message handled");
    assert!(sb.dead("q").is_empty());
}

#[test]
fn work_drain_on_an_empty_queue_piped_into_head_exits() {
    // The case seen hanging: `RUST_LOG=debug switchyard work … --drain 2>&1 | head -3`.
    let mut sb = Sandbox::new();
    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    chatty(&mut sb);
    for _ in 0..3 {
        let (read, write) = nix::unistd::pipe().expect("a pipe");
        let write2 = write.try_clone().expect("a second write end");
        let mut child = sb
            .cmd(&["work", "--queue", "q", "--exec", "true", "--drain"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(write))
            .stderr(Stdio::from(write2))
            .spawn()
            .expect("spawn switchyard");
        // `head -3`: read three lines, then leave.
        let mut reader = BufReader::new(std::fs::File::from(read));
        let mut line = String::new();
        for _ in 0..3 {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
        }
        drop(reader);
        let status = wait_at_most(
            &mut child,
            Duration::from_secs(30),
            "work --drain | head -3",
        );
        assert_clean_exit(status, "work --drain | head -3");
    }
}

#[test]
fn work_stopped_by_sigterm_with_its_output_closed_exits() {
    let mut sb = Sandbox::new();
    sb.publish_lines("q", "job", &"{}\n".repeat(20));
    chatty(&mut sb);
    let mut child = spawn_closed(sb.cmd(&["work", "--queue", "q", "--exec", "echo done"]));
    let deadline = Instant::now() + Duration::from_secs(30);
    sb.unset_env("RUST_LOG");
    while sb.ready("q") > 0 {
        assert!(Instant::now() < deadline, "the worker handled nothing");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = wait_at_most(&mut child, Duration::from_secs(30), "work after SIGTERM");
    assert_clean_exit(status, "work after SIGTERM");
}

#[test]
fn publish_from_stdin_with_its_output_closed_publishes_every_line() {
    let mut sb = Sandbox::new();
    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    chatty(&mut sb);
    let lines: String = (0..500).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let mut child = sb
        .cmd(&["publish", "--queue", "q", "--kind", "job"])
        .stdin(Stdio::piped())
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .spawn()
        .expect("spawn switchyard publish");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, lines.as_bytes()).expect("write the lines");
    drop(stdin);
    let status = wait_at_most(&mut child, Duration::from_secs(60), "publish");
    assert_clean_exit(status, "publish");
    sb.unset_env("RUST_LOG");
    assert_eq!(sb.ready("q"), 500, "every line published");
}

#[test]
fn stats_and_dead_list_with_their_output_closed_exit() {
    let mut sb = Sandbox::new();
    sb.publish_lines("q", "job", &"{}\n".repeat(5));
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
    assert_eq!(sb.dead("q").len(), 5);
    chatty(&mut sb);
    for args in [
        &["stats"][..],
        &["stats", "--json"],
        &["dead", "list", "--payload"],
        &["dead", "list", "--json"],
    ] {
        let mut child = spawn_closed(sb.cmd(args));
        let status = wait_at_most(&mut child, Duration::from_secs(30), &format!("{args:?}"));
        assert_clean_exit(status, &format!("{args:?}"));
    }
}

#[test]
fn serve_with_its_output_closed_answers_and_stops_on_sigterm() {
    let mut sb = Sandbox::new();
    let out = sb.run(&["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    chatty(&mut sb);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = spawn_closed(sb.cmd(&["serve", "--listen", &listen]));
    let url = format!("http://{listen}/api/stats");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answered = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(&url)
            .output()
            .map(|o| text(&o.stdout) == "200")
            .unwrap_or(false);
        if answered {
            break;
        }
        assert!(
            child.try_wait().expect("serve's status").is_none(),
            "serve exited with its output closed"
        );
        assert!(Instant::now() < deadline, "serve never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = wait_at_most(&mut child, Duration::from_secs(30), "serve after SIGTERM");
    assert_clean_exit(status, "serve after SIGTERM");
}
