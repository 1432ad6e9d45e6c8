//! Checkpoints across processes, on every backend, for a library handler and for a shell
//! script under `work --exec`: a job of 10,000 items checkpoints every 1,000.
//!
//! - Its worker is SIGKILLed at about item 5,000: the next worker resumes from the last
//!   checkpoint stored, finishes, and the checkpoint is removed.
//! - Its worker is frozen (SIGSTOP) at item 6,000, before that checkpoint: another
//!   worker takes the job over when the lease lapses (on RabbitMQ, when the broker
//!   misses the frozen connection's heartbeats) and resumes from 5,000; woken while the
//!   successor waits at item 8,000, the frozen one's checkpoint of 6,000 is refused by
//!   the store's fence, and the stored checkpoint stays the successor's 7,000.
//!
//! A run waits at its pause item until the test creates its `go-NAME` file.
//!
//! The library worker is this test binary run again as a child (the ignored test
//! `child_runs_imports`), so no extra binary is built.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use support::{Sandbox, Workers};
use switchyard::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use switchyard::{CancellationToken, QueueName};

const ITEMS: u64 = 10_000;

/// The exec worker's command: the same job as the library handler's, in `sh`.
const SCRIPT: &str = r#"trap '' TERM
echo $$ > "pid-$CKPT_NAME"
from=${SWITCHYARD_CHECKPOINT:-0}
echo "$CKPT_NAME resumed $from" >> runs
i=$from
while [ "$i" -lt 10000 ]; do
  i=$((i + 1))
  [ $((i % 50)) -eq 0 ] && sleep 0.01
  [ $((i % 100)) -eq 0 ] && echo "$i" > "at-$CKPT_NAME"
  if [ "$i" -eq "${CKPT_PAUSE_AT:-0}" ]; then
    echo "$i" > "paused-$CKPT_NAME"
    while [ ! -e "go-$CKPT_NAME" ]; do sleep 0.01; done
  fi
  if [ $((i % 1000)) -eq 0 ]; then
    "$CKPT_BIN" checkpoint "$i" 2>> refusals || { echo "$CKPT_NAME $i" >> refused; exit 1; }
  fi
done
echo "$CKPT_NAME done" >> runs
"#;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Library,
    Exec,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The job's stored checkpoint, read from the store as a worker would.
fn stored(sb: &Sandbox, id: &str) -> Option<u64> {
    let id = uuid::Uuid::parse_str(id).expect("a job id");
    runtime().block_on(async {
        let jobs = switchyard::connect_existing_jobs(&sb.config())
            .await
            .expect("open the store");
        let checkpoints = jobs
            .store()
            .and_then(|s| s.checkpoints())
            .expect("a store that keeps checkpoints");
        let value = checkpoints.load(id).await.expect("read the checkpoint");
        value.map(|v| v.parse().expect("a checkpoint of this test"))
    })
}

/// A worker process named `name` for `queue`, pausing at item `pause_at` (0: never).
fn worker(sb: &Sandbox, mode: Mode, queue: &str, name: &str, pause_at: u64) -> Child {
    let mut cmd = match mode {
        Mode::Library => {
            let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
            cmd.args(["--exact", "child_runs_imports", "--ignored", "--nocapture"])
                .current_dir(sb.dir.path())
                .env_clear()
                .envs(sb.envs())
                .env("CKPT_QUEUE", queue);
            cmd
        }
        Mode::Exec => sb.cmd(&["work", "--queue", queue, "--exec", "sh ./import.sh"]),
    };
    cmd.env("CKPT_NAME", name)
        .env("CKPT_PAUSE_AT", pause_at.to_string())
        .env("CKPT_BIN", env!("CARGO_BIN_EXE_switchyard"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
}

fn at(dir: &Path, name: &str) -> u64 {
    read(dir, &format!("at-{name}")).trim().parse().unwrap_or(0)
}

fn signal(child: &Child, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    kill(pid, sig).expect("signal the worker");
}

/// The process group of the command of an exec run (its own group, led by the
/// worker's `sh -c`); the library runs in its worker.
fn command_group(dir: &Path, mode: Mode, name: &str) -> Option<Pid> {
    if mode == Mode::Library {
        return None;
    }
    let pid = read(dir, &format!("pid-{name}"));
    let pid = Pid::from_raw(pid.trim().parse().expect("the script's pid"));
    Some(nix::unistd::getpgid(Some(pid)).expect("the command's process group"))
}

fn resumes_and_fences(mut sb: Sandbox, mode: Mode) {
    sb.set_env("QUEUE_VISIBILITY_TIMEOUT", "2s");
    if sb.rabbitmq {
        // A frozen worker's connection is closed, and its job handed on, after the
        // broker misses two heartbeats.
        sb.set_env("AMQP_URL", &format!("{}?heartbeat=2", support::amqp_url()));
    }
    std::fs::write(sb.path("import.sh"), SCRIPT).expect("write the script");
    let dir = sb.dir.path().to_path_buf();
    let tag = format!("{:08x}", fastrand::u32(..));

    // A worker killed at about item 5,000.
    let q1 = format!("ckpt-kill-{tag}");
    let id1 = sb.publish_lines(&q1, "import", "{}\n").remove(0);
    let mut a = worker(&sb, mode, &q1, "a", 0);
    wait_for("item 5,000", Duration::from_secs(60), || {
        at(&dir, "a") >= 5_000
    });
    // The whole host goes: the worker and the command it runs. The command's group is
    // read first: once its worker is gone, a command writing to its stdout may die of
    // the closed pipe before it could be looked up.
    let group = command_group(&dir, mode, "a");
    signal(&a, Signal::SIGKILL);
    let _ = a.wait();
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
    }
    let killed_at = at(&dir, "a");
    let last = stored(&sb, &id1).expect("a checkpoint before the kill");
    assert!(
        last % 1_000 == 0 && (4_000..=killed_at).contains(&last),
        "checkpoint {last}, killed at about {killed_at}"
    );
    let b = Workers(vec![worker(&sb, mode, &q1, "b", 0)]);
    wait_for("the resumed run's end", Duration::from_secs(60), || {
        read(&dir, "runs").contains("b done")
    });
    let runs = read(&dir, "runs");
    assert!(runs.contains(&format!("b resumed {last}")), "{runs}");
    wait_for("the checkpoint's removal", Duration::from_secs(10), || {
        stored(&sb, &id1).is_none()
    });
    b.stop();

    // A worker frozen at item 6,000, before that checkpoint, woken while its successor
    // runs.
    let q2 = format!("ckpt-zombie-{tag}");
    let id2 = sb.publish_lines(&q2, "import", "{}\n").remove(0);
    let zombie = worker(&sb, mode, &q2, "z", 6_000);
    wait_for("the pause at 6,000", Duration::from_secs(60), || {
        !read(&dir, "paused-z").is_empty()
    });
    let group = command_group(&dir, mode, "z");
    signal(&zombie, Signal::SIGSTOP);
    if let Some(group) = group {
        killpg(group, Signal::SIGSTOP).expect("freeze the command");
    }
    let workers = Workers(vec![zombie, worker(&sb, mode, &q2, "s", 8_000)]);
    wait_for(
        "the successor's pause at 8,000",
        Duration::from_secs(60),
        || !read(&dir, "paused-s").is_empty(),
    );
    assert_eq!(stored(&sb, &id2), Some(7_000), "the successor's checkpoint");
    // The frozen run wakes (its command first, so that its checkpoint is on its way
    // before the worker's heartbeat hears of the lost lease).
    std::fs::write(dir.join("go-z"), "").expect("let the frozen run go on");
    if let Some(group) = group {
        killpg(group, Signal::SIGCONT).expect("wake the command");
        std::thread::sleep(Duration::from_millis(300));
    }
    signal(&workers[0], Signal::SIGCONT);
    wait_for(
        "the stale checkpoint's refusal",
        Duration::from_secs(30),
        || read(&dir, "refused").contains("z 6000"),
    );
    assert_eq!(
        stored(&sb, &id2),
        Some(7_000),
        "a refused checkpoint changes nothing"
    );
    std::fs::write(dir.join("go-s"), "").expect("let the successor go on");
    wait_for("the successor's end", Duration::from_secs(60), || {
        read(&dir, "runs").contains("s done")
    });
    let runs = read(&dir, "runs");
    assert!(runs.contains("s resumed 5000"), "{runs}");
    assert!(!runs.contains("z done"), "{runs}");
    if mode == Mode::Library {
        assert!(
            read(&dir, "refused").contains("lease_lost=true"),
            "{}",
            read(&dir, "refused")
        );
    } else {
        let why = read(&dir, "refusals");
        assert!(why.contains("this checkpoint was refused"), "{why}");
    }
    workers.stop();
    if sb.rabbitmq {
        support::delete_broker_queue(&q1);
        support::delete_broker_queue(&q2);
    }
}

/// The library worker of [`resumes_and_fences`], run as a child process.
#[test]
#[ignore = "run as a child process by the checkpoint tests"]
fn child_runs_imports() {
    let (Ok(queue), Ok(name)) = (std::env::var("CKPT_QUEUE"), std::env::var("CKPT_NAME")) else {
        return;
    };
    let pause_at: u64 = std::env::var("CKPT_PAUSE_AT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let config = switchyard::Config::from_env().expect("the sandbox's configuration");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async move {
            let jobs = switchyard::connect_jobs(&config).await.expect("connect");
            let queue = QueueName::new(queue).expect("a queue name");
            let worker = Worker::for_jobs(&jobs, queue, WorkerOptions::default()).handle(
                "import",
                handler_fn(move |ctx: JobContext| {
                    let name = name.clone();
                    async move { import(ctx, &name, pause_at).await }
                }),
            );
            worker
                .run(CancellationToken::new())
                .await
                .expect("the worker runs");
        });
}

/// The job: items from the last checkpoint to 10,000, a checkpoint every 1,000.
async fn import(ctx: JobContext, name: &str, pause_at: u64) -> switchyard::worker::JobResult {
    let append = |file: &str, line: String| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .expect("open a record");
        writeln!(f, "{line}").expect("write a record");
    };
    let from = ctx.checkpoint_as::<u64>().await?.unwrap_or(0);
    append("runs", format!("{name} resumed {from}"));
    for i in from + 1..=ITEMS {
        if i % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if i % 100 == 0 {
            std::fs::write(format!("at-{name}"), i.to_string()).expect("write progress");
        }
        if i == pause_at {
            // Until the test says go.
            std::fs::write(format!("paused-{name}"), "paused").expect("write the pause");
            while !Path::new(&format!("go-{name}")).exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if i % 1_000 == 0 {
            if let Err(e) = ctx.checkpoint(&i).await {
                append(
                    "refused",
                    format!("{name} {i} lease_lost={} {e}", e.is_lease_lost()),
                );
                return Err(e.into());
            }
        }
    }
    append("runs", format!("{name} done"));
    Ok(())
}

#[test]
fn a_library_job_resumes_and_fences_on_sqlite() {
    resumes_and_fences(Sandbox::new(), Mode::Library);
}

#[test]
fn a_library_job_resumes_and_fences_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        resumes_and_fences(sb, Mode::Library);
    }
}

#[test]
fn a_library_job_resumes_and_fences_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        resumes_and_fences(sb, Mode::Library);
    }
}

#[test]
fn a_library_job_resumes_and_fences_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        resumes_and_fences(sb, Mode::Library);
    }
}

#[test]
fn an_exec_job_resumes_and_fences_on_sqlite() {
    resumes_and_fences(Sandbox::new(), Mode::Exec);
}

#[test]
fn an_exec_job_resumes_and_fences_on_postgres() {
    if let Some(sb) = Sandbox::postgres() {
        resumes_and_fences(sb, Mode::Exec);
    }
}

#[test]
fn an_exec_job_resumes_and_fences_on_mysql() {
    if let Some(sb) = Sandbox::mysql() {
        resumes_and_fences(sb, Mode::Exec);
    }
}

#[test]
fn an_exec_job_resumes_and_fences_on_rabbitmq() {
    if let Some(sb) = Sandbox::rabbitmq() {
        resumes_and_fences(sb, Mode::Exec);
    }
}
