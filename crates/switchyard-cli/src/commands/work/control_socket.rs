//! The channel from an exec command back to its worker: a Unix socket per `work`
//! process (its path in `SWITCHYARD_CONTROL_SOCKET`, in a directory only its user can
//! enter), on which `switchyard progress` sends one JSON line naming the job and its
//! lease token (`switchyard checkpoint` too), and reads one back.
//!
//! The worker answers for a job it is running under that very token only, and only
//! while that lease surely holds, so a command left running by a worker that lost its
//! lease (or a stray script) changes nothing of the run that took over.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard::worker::JobContext;
use switchyard::{CancellationToken, Error, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::control_protocol::{Reply, Request, MAX_LINE};

/// How long a request line may take to arrive.
const READ_WITHIN: Duration = Duration::from_secs(5);
/// Connections answered at once; more wait.
const AT_ONCE: usize = 64;

/// A running job's key: its tenant (one process may serve several, whose ids can
/// repeat), id and lease token.
type Key = (String, Uuid, String);

/// The jobs this process runs, with their contexts.
#[derive(Debug, Default)]
pub(crate) struct Running(Mutex<HashMap<Key, JobContext>>);

/// The socket and the running jobs it answers for.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    /// The socket's path, handed to commands.
    pub(crate) path: PathBuf,
    running: Arc<Running>,
    /// The directory holding it, removed when the worker ends.
    _dir: tempfile::TempDir,
}

/// A job registered while its command runs; unregistered when dropped.
pub(crate) struct Registered {
    running: Arc<Running>,
    key: Key,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut jobs) = self.running.0.lock() {
            jobs.remove(&self.key);
        }
    }
}

impl ControlSocket {
    /// Listens on a socket in a fresh private directory until `stop` (the process's
    /// abort: commands still finishing in a graceful shutdown's grace period report on).
    pub(crate) fn start(stop: CancellationToken) -> Result<Arc<Self>> {
        let dir = tempfile::Builder::new()
            .prefix("switchyard-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|source| Error::Io {
                what: "making a directory for the command control socket".into(),
                source,
            })?;
        let path = dir.path().join("control.sock");
        let listener = UnixListener::bind(&path).map_err(|source| Error::Io {
            what: format!("listening on {}", path.display()),
            source,
        })?;
        let socket = Arc::new(ControlSocket {
            path,
            running: Arc::default(),
            _dir: dir,
        });
        let running = socket.running.clone();
        let slots = Arc::new(Semaphore::new(AT_ONCE));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                match accepted {
                    Ok((stream, _)) => {
                        let (running, slots) = (running.clone(), slots.clone());
                        tokio::spawn(async move {
                            if let Ok(_slot) = slots.acquire().await {
                                answer(stream, &running).await;
                            }
                        });
                    }
                    Err(e) => tracing::debug!(error = %e, "control socket accept failed"),
                }
            }
        });
        Ok(socket)
    }

    /// Registers a running job for the lifetime of the returned guard.
    pub(crate) fn register(&self, ctx: &JobContext) -> Registered {
        let key = key_of(ctx);
        self.running.insert(key.clone(), ctx.clone());
        Registered {
            running: self.running.clone(),
            key,
        }
    }
}

fn key_of(ctx: &JobContext) -> Key {
    (
        ctx.tenant().unwrap_or_default().to_owned(),
        ctx.envelope.id,
        ctx.lease_token.to_string(),
    )
}

impl Running {
    fn insert(&self, key: Key, ctx: JobContext) {
        if let Ok(mut jobs) = self.0.lock() {
            jobs.insert(key, ctx);
        }
    }

    /// The context of the job a request names, or why there is none.
    fn find(&self, req: &Request) -> std::result::Result<JobContext, String> {
        let jobs = self
            .0
            .lock()
            .map_err(|_| "the worker's job table is unusable".to_owned())?;
        let tenant = req.tenant.clone().unwrap_or_default();
        let key = (tenant.clone(), req.id, req.token.clone());
        if let Some(ctx) = jobs.get(&key) {
            return Ok(ctx.clone());
        }
        if jobs.keys().any(|(t, id, _)| *t == tenant && *id == req.id) {
            return Err(format!(
                "job {} is running under another lease: this command's run was overtaken",
                req.id
            ));
        }
        Err(format!("this worker is not running job {}", req.id))
    }
}

async fn answer(stream: UnixStream, running: &Running) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_LINE);
    let reply = match tokio::time::timeout(READ_WITHIN, reader.read_line(&mut line)).await {
        Ok(Ok(_)) if !line.ends_with('\n') && line.len() as u64 >= MAX_LINE => refuse(format!(
            "a request is one line of {} KiB at most",
            MAX_LINE / 1024
        )),
        Ok(Ok(_)) => handle(&line, running).await,
        Ok(Err(e)) => refuse(format!("reading the request failed: {e}")),
        Err(_) => refuse(format!(
            "no request line within {} s",
            READ_WITHIN.as_secs()
        )),
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

fn refuse(why: String) -> Reply {
    Reply {
        ok: false,
        error: Some(why),
    }
}

async fn handle(line: &str, running: &Running) -> Reply {
    let req: Request = match serde_json::from_str(line) {
        Ok(req) => req,
        Err(e) => return refuse(format!("not a request: {e}")),
    };
    if let Some(percent) = req.progress.filter(|p| *p > 100) {
        return refuse(format!("progress {percent}: accepted are 0 to 100"));
    }
    let ctx = match running.find(&req) {
        Ok(ctx) => ctx,
        Err(why) => return refuse(why),
    };
    match (req.progress, req.checkpoint) {
        (Some(percent), None) => {
            // The token matches, but a worker stopped past half its lease may have lost
            // it to another process without knowing yet.
            if !ctx.is_current() || ctx.cancel.is_cancelled() {
                return refuse(format!(
                    "job {}'s run is being stopped or may have lost its lease",
                    req.id
                ));
            }
            if !ctx.keeps_status() {
                return refuse("this worker keeps no job status (QUEUE_STATUS=off, or RabbitMQ without DATABASE_URL): progress has nowhere to go".into());
            }
            ctx.progress(percent, req.note.unwrap_or_default());
        }
        // The store fences a checkpoint by the lease itself: a run told to stop (a
        // timeout, a shutdown) may still store its last one while its lease holds.
        (None, Some(checkpoint)) => match ctx.save_checkpoint_json(&checkpoint).await {
            Ok(()) => {}
            Err(e) if e.is_lease_lost() => {
                return refuse(format!(
                "job {}'s run lost its lease: another run has it, and this checkpoint was refused",
                req.id
            ))
            }
            Err(e) => return refuse(e.to_string()),
        },
        _ => return refuse("a request carries progress or a checkpoint, one of them".into()),
    }
    Reply {
        ok: true,
        error: None,
    }
}
