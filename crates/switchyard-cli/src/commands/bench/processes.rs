//! The drain with the worker in other processes, as a deployment runs several worker
//! processes on one store: the bench runs itself again as `switchyard bench-drain`, once
//! per process, starts them together, and times them until every job was handled.
//!
//! Each child says `ready` once connected, starts its worker on `go`, prints how many
//! jobs it handled every few milliseconds, and, when its input closes, stops and prints
//! its totals: handled, the time of its last job, and what its optimistic claims lost.

use std::process::Stdio;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use switchyard::worker::{handler_fn, JobContext, Worker, WorkerOptions};
use switchyard::{CancellationToken, ClaimCounters, Config, Error, Result, Transport};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::remote;
use super::workload::{jobs, queue};
use crate::cli::{BenchArgs, BenchDrainArgs};

/// How often a child prints its count.
const PROGRESS_EVERY: Duration = Duration::from_millis(5);
/// How long the children may take to connect, and to drain.
const CONNECT_WITHIN: Duration = Duration::from_secs(60);
const DRAIN_WITHIN: Duration = Duration::from_secs(300);
/// How long a child may take to stop once told.
const STOP_WITHIN: Duration = Duration::from_secs(60);

/// What a child prints when it stops.
#[derive(Debug, Serialize, Deserialize)]
struct Totals {
    handled: u64,
    /// When it handled its last job, ns since the epoch (0: none).
    last_ns: i64,
    /// What its optimistic claims lost, where the transport counts it.
    counters: Option<(u64, u64, u64)>,
}

/// One drain by `processes` worker processes.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ProcessDrain {
    /// Worker processes.
    pub(super) processes: usize,
    /// Jobs handled per second, from `go` to the last job handled.
    pub(super) per_s: f64,
    /// Rows the optimistic claims lost to competitors over the rows they tried to take
    /// (SQL backends; 0 for skip-locked claims, which try only rows they locked).
    pub(super) wasted_claim_ratio: Option<f64>,
    /// Optimistic compare-and-sets that lost a deadlock or a lock wait and ran again.
    pub(super) conflicts: Option<u64>,
    /// Jobs handled more than once, and jobs not handled.
    pub(super) duplicates: u64,
    pub(super) missing: u64,
}

/// The drains of `args.processes` worker processes each, after `args.backlog` rows of
/// other queues were published into the store.
pub(super) async fn drains(
    config: &Config,
    t: &Arc<dyn Transport>,
    args: &BenchArgs,
) -> Result<Vec<ProcessDrain>> {
    let counts: Vec<usize> = args.processes.iter().copied().filter(|&n| n > 0).collect();
    if counts.is_empty() {
        return Ok(Vec::new());
    }
    let mut left = args.backlog;
    while left > 0 {
        let batch = left.min(1_000);
        t.publish_batch(jobs(&queue("backlog")?, batch)?).await?;
        left -= batch;
    }
    let mut out = Vec::with_capacity(counts.len());
    for n in counts {
        out.push(drain(config, t, n, args.messages, args.concurrency).await?);
    }
    Ok(out)
}

/// Publishes `messages` jobs through `t` and drains them with `processes` worker
/// processes of `concurrency` slots each, on the store `config` describes.
async fn drain(
    config: &Config,
    t: &Arc<dyn Transport>,
    processes: usize,
    messages: usize,
    concurrency: usize,
) -> Result<ProcessDrain> {
    let q = queue("procs")?;
    for chunk in jobs(&q, messages)?.chunks(1_000) {
        t.publish_batch(chunk.to_vec()).await?;
    }
    let mut children = Vec::with_capacity(processes);
    for _ in 0..processes {
        children.push(Running::start(config, q.as_str(), concurrency)?);
    }
    for child in &mut children {
        child.ready().await?;
    }
    let go_ns = remote::now_ns();
    for child in &mut children {
        child.go().await?;
    }
    let deadline = Instant::now() + DRAIN_WITHIN;
    while children.iter().map(Running::handled).sum::<u64>() < messages as u64 {
        if children.iter().any(|c| c.reader.is_finished()) {
            return Err(Error::InvalidInput(
                "bench: a worker process ended before the jobs were drained (see its error above)"
                    .into(),
            ));
        }
        if Instant::now() > deadline {
            return Err(Error::InvalidInput(format!(
                "bench: {processes} worker processes did not drain {messages} jobs within {} s",
                DRAIN_WITHIN.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut totals = Vec::with_capacity(processes);
    for child in children {
        totals.push(child.stop().await?);
    }
    let handled: u64 = totals.iter().map(|t| t.handled).sum();
    // The counts cannot tell a duplicate from a job never handled: what is left in the
    // queue can.
    let left: u64 = t
        .stats(Some(&q))
        .await?
        .iter()
        .filter(|s| s.queue == q.as_str())
        .map(|s| s.ready + s.delayed + s.reserved)
        .sum();
    let last_ns = totals.iter().map(|t| t.last_ns).max().unwrap_or(go_ns);
    let elapsed = Duration::from_nanos(u64::try_from(last_ns - go_ns).unwrap_or(1).max(1));
    let counted: Option<Vec<(u64, u64, u64)>> = totals.iter().map(|t| t.counters).collect();
    let sum = counted.map(|c| {
        c.iter()
            .fold((0, 0, 0), |a, c| (a.0 + c.0, a.1 + c.1, a.2 + c.2))
    });
    Ok(ProcessDrain {
        processes,
        per_s: messages as f64 / elapsed.as_secs_f64(),
        wasted_claim_ratio: sum.map(|(req, wasted, _)| {
            if req == 0 {
                0.0
            } else {
                wasted as f64 / req as f64
            }
        }),
        conflicts: sum.map(|(_, _, c)| c),
        duplicates: (handled + left).saturating_sub(messages as u64),
        missing: left,
    })
}

/// A worker process of the bench.
struct Running {
    child: Child,
    input: Option<ChildStdin>,
    handled: Arc<AtomicU64>,
    /// Reads its output: `ready`, then counts, then its totals.
    reader: tokio::task::JoinHandle<Result<Totals>>,
    ready: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Running {
    fn start(config: &Config, queue: &str, concurrency: usize) -> Result<Running> {
        let mut cmd = remote::command(
            config,
            &[
                "bench-drain",
                "--queue",
                queue,
                "--concurrency",
                &concurrency.to_string(),
            ],
        )?;
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io("starting a bench worker process", e))?;
        let (input, output) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                return Err(Error::InvalidInput(
                    "bench: a worker process has no standard input or output".into(),
                ))
            }
        };
        let handled = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(read_output(output, handled.clone(), ready_tx));
        Ok(Running {
            child,
            input: Some(input),
            handled,
            reader,
            ready: Some(ready),
        })
    }

    async fn ready(&mut self) -> Result<()> {
        let Some(ready) = self.ready.take() else {
            return Ok(());
        };
        match tokio::time::timeout(CONNECT_WITHIN, ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Error::InvalidInput(
                "bench: a worker process did not start (see its error above)".into(),
            )),
        }
    }

    async fn go(&mut self) -> Result<()> {
        if let Some(input) = self.input.as_mut() {
            input
                .write_all(b"go\n")
                .await
                .map_err(|e| Error::io("starting a bench worker process", e))?;
            input
                .flush()
                .await
                .map_err(|e| Error::io("starting a bench worker process", e))?;
        }
        Ok(())
    }

    fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Closes its input, and reads its totals once it stopped.
    async fn stop(mut self) -> Result<Totals> {
        drop(self.input.take());
        let stopped = async {
            let totals = self.reader.await.map_err(|e| {
                Error::InvalidInput(format!("bench: reading a worker failed: {e}"))
            })??;
            let status = self
                .child
                .wait()
                .await
                .map_err(|e| Error::io("waiting for a bench worker process", e))?;
            Ok::<_, Error>((totals, status))
        };
        let (totals, status) =
            tokio::time::timeout(STOP_WITHIN, stopped)
                .await
                .map_err(|_| {
                    Error::InvalidInput(format!(
                        "bench: a worker process did not stop within {} s",
                        STOP_WITHIN.as_secs()
                    ))
                })??;
        if !status.success() {
            return Err(Error::InvalidInput(format!(
                "bench: a worker process failed ({status})"
            )));
        }
        Ok(totals)
    }
}

/// Reads a child's output until its totals.
async fn read_output(
    output: ChildStdout,
    handled: Arc<AtomicU64>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Result<Totals> {
    let mut lines = BufReader::new(output).lines();
    let mut ready = Some(ready);
    let read_failed = |e| Error::io("reading a bench worker process", e);
    while let Some(line) = lines.next_line().await.map_err(read_failed)? {
        if line == "ready" {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        } else if let Ok(n) = line.parse::<u64>() {
            handled.store(n, Ordering::Relaxed);
        } else if let Ok(totals) = serde_json::from_str::<Totals>(&line) {
            handled.store(totals.handled, Ordering::Relaxed);
            return Ok(totals);
        }
    }
    Err(Error::InvalidInput(
        "bench: a worker process ended without its totals".into(),
    ))
}

/// The child: a worker on `args.queue` with default options, started on `go` and
/// stopped when its input closes.
pub(crate) async fn drain_in_process(config: &Config, args: BenchDrainArgs) -> Result<()> {
    let (t, counters) = open_counted(config).await?;
    let q = switchyard::QueueName::new(args.queue)?;
    let handled = Arc::new(AtomicU64::new(0));
    let last_ns = Arc::new(AtomicI64::new(0));
    let (h, l) = (handled.clone(), last_ns.clone());
    let worker = Worker::new(
        t,
        q,
        WorkerOptions::default().with_concurrency(args.concurrency),
    )
    .handle(
        "noop",
        handler_fn(move |_: JobContext| {
            h.fetch_add(1, Ordering::Relaxed);
            l.store(remote::now_ns(), Ordering::Relaxed);
            async { Ok(()) }
        }),
    );
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    say("ready")?;
    let read_failed = |e| Error::io("reading the bench's instructions", e);
    if input.next_line().await.map_err(read_failed)?.as_deref() != Some("go") {
        return Ok(());
    }
    let before = counters();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let mut said = 0;
    let mut closed =
        std::pin::pin!(async move { while let Ok(Some(_)) = input.next_line().await {} });
    loop {
        tokio::select! {
            _ = &mut closed => break,
            _ = tick.tick() => {
                let n = handled.load(Ordering::Relaxed);
                if n != said {
                    say(&n.to_string())?;
                    said = n;
                }
            }
        }
    }
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("bench worker failed: {e}")))??;
    let counters = match (before, counters()) {
        (Some(before), Some(after)) => {
            let c = after.since(&before);
            Some((c.requested, c.wasted, c.conflicts))
        }
        _ => None,
    };
    let totals = Totals {
        handled: handled.load(Ordering::Relaxed),
        last_ns: last_ns.load(Ordering::Relaxed),
        counters,
    };
    let line =
        serde_json::to_string(&totals).map_err(|e| Error::InvalidInput(format!("bench: {e}")))?;
    say(&line)
}

/// One line to the bench, at once.
fn say(line: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::io("writing to the bench", e))
}

/// Reads what a transport's optimistic claims lost (`None` where it keeps no count).
type Counters = Box<dyn Fn() -> Option<ClaimCounters> + Send + Sync>;

/// The store `config` describes, and its claim counters where it keeps them.
async fn open_counted(config: &Config) -> Result<(Arc<dyn Transport>, Counters)> {
    let scheme = config.database_url.scheme();
    #[cfg(feature = "postgres")]
    if config.backend != switchyard::BackendKind::RabbitMq
        && matches!(scheme.as_str(), "postgres" | "postgresql")
    {
        let t = Arc::new(
            switchyard::PgTransport::connect(switchyard::PgOptions::from_config(config)).await?,
        );
        let c = t.clone();
        return Ok((t, Box::new(move || Some(c.claim_counters()))));
    }
    #[cfg(feature = "mysql")]
    if config.backend != switchyard::BackendKind::RabbitMq
        && matches!(scheme.as_str(), "mysql" | "mariadb")
    {
        let t = Arc::new(
            switchyard::MySqlTransport::connect(switchyard::MySqlOptions::from_config(config))
                .await?,
        );
        let c = t.clone();
        return Ok((t, Box::new(move || Some(c.claim_counters()))));
    }
    #[cfg(feature = "sqlite")]
    if config.backend != switchyard::BackendKind::RabbitMq && scheme == "sqlite" {
        let options = switchyard::SqliteOptions::from_config(config).with_create_if_missing(false);
        let t = Arc::new(switchyard::SqliteTransport::connect(options).await?);
        let c = t.clone();
        return Ok((t, Box::new(move || Some(c.claim_counters()))));
    }
    let _ = scheme;
    Ok((remote::open(config).await?, Box::new(|| None)))
}
